"""README's "The loop is yours" snippet runs as written (on the tiny model instead of SmolLM2)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_loop() -> str:
    text = README.read_text()
    section = text.split("## The loop is yours", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_loop_runs_on_the_tiny_model(tmp_path, monkeypatch, capsys):
    code = readme_loop()
    assert 'create_lora_training_client("smollm2-135m-instruct"' in code
    code = code.replace('"smollm2-135m-instruct"', '"tiny"').replace('rlkit.connect("local")', f'rlkit.connect("local", checkpoint_dir={str(tmp_path)!r})')
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme"}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - the README's own code
    losses = [float(x) for x in capsys.readouterr().out.split()]
    assert len(losses) >= 10 and losses[9] < losses[0]  # ten SFT steps (and a PPO step if the group varied)
    namespace["service"].close()
