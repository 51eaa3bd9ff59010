// The official `openai` npm package against `rlkit serve`.
//   node check_client.mjs BASE_URL API_KEY MODEL
// Prints one JSON object with what each call returned; exits 1 on the first broken expectation.
import OpenAI from "openai";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const messages = [{ role: "user", content: "Say something." }];
const out = {};

function expect(ok, what) {
  if (!ok) {
    console.log(JSON.stringify({ ...out, failed: what }));
    process.exit(1);
  }
}

// plain
const plain = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
out.plain = { content: plain.choices[0].message.content, finish_reason: plain.choices[0].finish_reason, usage: plain.usage };
expect(plain.object === "chat.completion" && typeof plain.choices[0].message.content === "string", "plain completion shape");
expect(plain.usage.total_tokens === plain.usage.prompt_tokens + plain.usage.completion_tokens, "usage adds up");

// streamed: the deltas add up to the same greedy text
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
});
let streamed = "";
let chunks = 0;
let streamUsage = null;
for await (const chunk of stream) {
  chunks += 1;
  if (chunk.usage) streamUsage = chunk.usage;
  for (const choice of chunk.choices) streamed += choice.delta?.content ?? "";
}
out.stream = { content: streamed, chunks, usage: streamUsage };
expect(streamed === plain.choices[0].message.content, "streamed text equals non-streamed text");
expect(streamUsage && streamUsage.completion_tokens === plain.usage.completion_tokens, "usage chunk");

// n, seed, logprobs
const many = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 1, n: 2, seed: 7, logprobs: true, top_logprobs: 2 });
out.n = many.choices.map((c) => c.message.content);
expect(many.choices.length === 2 && many.choices[1].index === 1, "n=2 gives two choices");
const lp = many.choices[0].logprobs.content;
out.logprobs = lp.map((e) => [e.token, e.logprob, e.top_logprobs.length]);
expect(lp.length > 0 && lp.every((e) => e.logprob <= 0 && e.top_logprobs.length === 2), "logprobs with 2 alternatives");
const again = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 1, n: 2, seed: 7 });
expect(JSON.stringify(again.choices.map((c) => c.message.content)) === JSON.stringify(out.n), "seed reproduces");

// stop
const stopped = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0, stop: ["\n"] });
out.stop = { content: stopped.choices[0].message.content, finish_reason: stopped.choices[0].finish_reason };
expect(!stopped.choices[0].message.content.includes("\n"), "stop sequence excluded");

// models
const models = [];
for await (const m of client.models.list()) models.push(m.id);
out.models = models;
expect(models.includes(model), "models list");

// errors: typed exceptions carrying OpenAI's error body
try {
  await client.chat.completions.create({ model, messages: [], max_tokens: 1 });
  expect(false, "an empty messages array is refused");
} catch (err) {
  expect(err instanceof OpenAI.BadRequestError, `BadRequestError, got ${err?.constructor?.name}`);
  out.bad_request = { status: err.status, code: err.code, param: err.param, type: err.type, message: err.message };
}
try {
  await new OpenAI({ baseURL, apiKey: "sk-wrong", maxRetries: 0 }).chat.completions.create({ model, messages, max_tokens: 1 });
  expect(false, "a wrong key is refused");
} catch (err) {
  expect(err instanceof OpenAI.AuthenticationError, `AuthenticationError, got ${err?.constructor?.name}`);
  out.auth = { status: err.status, code: err.code };
}
console.log(JSON.stringify({ ...out, ok: true }));
