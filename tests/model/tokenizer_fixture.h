// Loader of the text fixtures in tests/model/data written by
// make_tokenizer_fixtures.js: real vocabularies trimmed to a corpus, with the
// ids transformers.js gives for each corpus text, and rendered chat templates.
// Text fields are escaped: \\ \n \r \t \s (space) \xHH, and "\0" alone for
// the empty string.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "longctx/model/tokenizer.h"

namespace longctx::model::testing {

inline std::string data_path(const std::string& name) {
  return std::string(LONGCTX_SOURCE_DIR) + "/tests/model/data/" + name;
}

inline std::string unescape_field(std::string_view s) {
  if (s == "\\0") return "";
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    if (c == 'n') out += '\n';
    else if (c == 'r') out += '\r';
    else if (c == 't') out += '\t';
    else if (c == 's') out += ' ';
    else if (c == 'x' && i + 2 < s.size() + 1) {
      out += char(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += c;  // "\\"
    }
  }
  return out;
}

inline std::vector<std::string> split_spaces(std::string_view line) {
  std::vector<std::string> words;
  std::istringstream in{std::string(line)};
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') lines.push_back(line);
  return lines;
}

struct TokenizerCase {
  std::string text;
  std::vector<int32_t> ids;
};

struct TokenizerFixture {
  Vocab vocab;
  std::vector<TokenizerCase> cases;
};

// Ids the fixture does not list become unused placeholders that no text can
// reach, so the listed tokens keep their real ids.
inline TokenizerFixture load_tokenizer_fixture_file(const std::string& path) {
  TokenizerFixture f;
  Vocab& v = f.vocab;
  int64_t n_vocab = 0;
  std::vector<bool> listed;
  for (const std::string& line : read_lines(path)) {
    const std::vector<std::string> w = split_spaces(line);
    const std::string& key = w.at(0);
    if (key == "kind") {
      v.kind = w.at(1) == "spm" ? TokenizerKind::kSpm : TokenizerKind::kBpe;
    } else if (key == "pre") {
      v.pre = parse_pre_tokenizer(w.at(1));
    } else if (key == "n_vocab") {
      n_vocab = std::stoll(w.at(1));
      v.tokens.resize(size_t(n_vocab));
      v.scores.assign(size_t(n_vocab), 0.f);
      v.types.assign(size_t(n_vocab), TokenType::kUnused);
      listed.assign(size_t(n_vocab), false);
    } else if (key == "bos" || key == "eos" || key == "eot" || key == "unk" || key == "pad") {
      const int32_t id = std::stoi(w.at(1));
      (key == "bos" ? v.bos : key == "eos" ? v.eos : key == "eot" ? v.eot : key == "unk" ? v.unk : v.pad) = id;
    } else if (key == "add_bos") {
      v.add_bos = w.at(1) == "1";
    } else if (key == "add_space_prefix") {
      v.add_space_prefix = w.at(1) == "1";
    } else if (key == "token") {
      const auto id = size_t(std::stoll(w.at(1)));
      v.types.at(id) = TokenType(std::stoi(w.at(2)));
      v.scores.at(id) = std::stof(w.at(3));
      v.tokens.at(id) = unescape_field(w.at(4));
      listed.at(id) = true;
    } else if (key == "merge") {
      v.merges.push_back(unescape_field(w.at(1)) + " " + unescape_field(w.at(2)));
    } else if (key == "case") {
      f.cases.push_back({unescape_field(line.substr(5)), {}});
    } else if (key == "ids") {
      for (size_t i = 1; i < w.size(); ++i) f.cases.back().ids.push_back(std::stoi(w[i]));
    } else {
      ADD_FAILURE() << path << ": unknown line " << line;
    }
  }
  for (size_t i = 0; i < listed.size(); ++i)
    if (!listed[i]) v.tokens[i] = "<placeholder_" + std::to_string(i) + ">";
  if (v.kind == TokenizerKind::kBpe) v.scores.clear();
  return f;
}

// A fixture of tests/model/data by file name.
inline TokenizerFixture load_tokenizer_fixture(const std::string& name) {
  return load_tokenizer_fixture_file(data_path(name));
}

}  // namespace longctx::model::testing
