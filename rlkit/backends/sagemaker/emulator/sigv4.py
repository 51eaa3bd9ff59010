"""SigV4 signature verification for the emulator (when it is started with a secret access key).

The signature is recomputed with botocore's own SigV4 machinery (:class:`botocore.auth.SigV4Auth`:
canonical request, string to sign, signing key) from what arrived: the method, the path and query
as sent, the headers the ``Authorization`` header names in ``SignedHeaders`` (with their received
values), the body, and the request's ``X-Amz-Date``, for the region and service of the credential
scope. It is compared in constant time. Refused, each with a 403 ``InvalidSignatureException`` in
the service's error shape: a signature that does not match (another secret, or anything signed
changed on the way), a missing or malformed ``Authorization``/``X-Amz-Date``, a credential scope
whose date is not the request's, an ``X-Amz-Content-SHA256`` that is not the body's hash, and an
``X-Amz-Date`` more than :data:`MAX_SKEW_S` from the emulator's clock (a stale or replayed request).

Limits: the body checked is the one the handler sees, after any ``Content-Encoding`` was undone,
so a request compressed before it was signed does not verify (the SageMaker APIs are not sent
compressed by botocore); a request replayed within the skew window is not detected.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
from typing import Dict, Optional

from rlkit.backends.sagemaker.emulator.shapes import ServiceError

MAX_SKEW_S = 15 * 60  # what AWS allows between a request's X-Amz-Date and its own clock
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+)\s*,\s*SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<sig>[0-9a-f]+)\s*$"
)


def _refuse(message: str) -> ServiceError:
    return ServiceError("InvalidSignatureException", message, 403)


def verify(method: str, raw_path: str, headers: Dict[str, str], body: bytes, secret_key: str,
           now: Optional[dt.datetime] = None) -> None:
    """Raise a 403 :class:`ServiceError` unless the request carries a valid SigV4 signature made
    with ``secret_key`` (``headers`` lower-cased, ``raw_path`` the path and query as sent)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    m = _AUTH.match(headers.get("authorization", "").strip())
    if m is None:
        raise _refuse("Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' (AWS4-HMAC-SHA256)")
    parts = m.group("cred").split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise _refuse("Credential should be scoped to a valid region, service and 'aws4_request'")
    access_key, day, region, service, _ = parts
    amz_date = headers.get("x-amz-date", "")
    try:
        when = dt.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        raise _refuse("The request must carry an X-Amz-Date header (yyyyMMddTHHmmssZ)") from None
    if day != amz_date[:8]:
        raise _refuse(f"Credential scope date {day} is not the request's date {amz_date[:8]}")
    now = now or dt.datetime.now(dt.timezone.utc)
    if abs((now - when).total_seconds()) > MAX_SKEW_S:
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        raise _refuse(f"Signature expired: {amz_date} is more than 15 minutes from the emulator's time {stamp}")
    signed = m.group("signed").split(";")
    if "host" not in signed or any(name not in headers for name in signed):
        raise _refuse("SignedHeaders must include host, and every signed header must be present")
    declared = headers.get("x-amz-content-sha256")
    if declared is not None and not hmac.compare_digest(declared.encode(), hashlib.sha256(body).hexdigest().encode()):
        raise _refuse("X-Amz-Content-SHA256 is not the hash of the request body")
    request = AWSRequest(method=method, url=f"http://{headers['host']}{raw_path}", data=body,
                         headers={name: headers[name] for name in signed})
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(access_key, secret_key), service, region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected.encode(), m.group("sig").encode()):
        raise _refuse("The request signature we calculated does not match the signature you provided. "
                      "Check your AWS Secret Access Key and signing method.")
