// longctx-server through the official OpenAI Node client (npm "openai"):
//   node openai_client.mjs BASE_URL DOCUMENT_FILE KEY EXPECTED_ANSWER_FILE
// Exits 1 with a message on the first failed check.
import fs from "node:fs";

import { check, checks } from "./check.mjs";
import OpenAI from "openai";

const [baseURL, docPath, key, expectedPath] = process.argv.slice(2);
const doc = fs.readFileSync(docPath, "utf8").trim();
const expected = fs.readFileSync(expectedPath, "utf8");
const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", maxRetries: 0 });

const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === "demo", "models.list", JSON.stringify(models.data));

const messages = [{ role: "user", content: doc + "\n\nWhat is the pass key?" }];
const answer = await client.chat.completions.create({ model: "demo", messages, temperature: 0 });
const text = answer.choices[0].message.content;
check(text === expected, "chat.completions: longctx-chat's answer", JSON.stringify([text, expected]));
check(text.includes(key), "chat.completions: the pass key", text);
check(answer.usage.prompt_tokens > 1000, "chat.completions: usage", JSON.stringify(answer.usage));

const stream = await client.chat.completions.create({
  model: "demo", messages, stream: true, stream_options: { include_usage: true },
});
let streamed = "";
let usage = null;
for await (const chunk of stream) {
  if (chunk.choices.length) streamed += chunk.choices[0].delta.content || "";
  if (chunk.usage) usage = chunk.usage;
}
check(streamed === expected, "chat.completions stream: the same answer", JSON.stringify(streamed));
check(usage && usage.prompt_tokens_details.cached_tokens > 1000, "stream: usage with cached tokens",
      JSON.stringify(usage));

const completion = await client.completions.create({ model: "demo", prompt: doc + "\n\nThe pass key is", max_tokens: 8 });
check(typeof completion.choices[0].text === "string" && completion.usage.completion_tokens <= 8, "completions",
      JSON.stringify(completion));
let completionStreamed = 0;
for await (const chunk of await client.completions.create({ model: "demo", prompt: "Hello", max_tokens: 4, stream: true }))
  completionStreamed += chunk.choices.length;
check(completionStreamed >= 1, "completions stream");

try {
  await client.chat.completions.create({ model: "gpt-4", messages });
  check(false, "an unknown model is refused");
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 404 && /does not exist/.test(e.message),
        "an unknown model: APIError 404", String(e));
}
try {
  await client.chat.completions.create({ model: "demo", messages: [] });
  check(false, "empty messages are refused");
} catch (e) {
  check(e instanceof OpenAI.APIError && e.status === 400 && e.param === "messages", "empty messages: 400", String(e));
}
console.log(`openai_client: ${checks.passed} checks passed`);
