// The quality sets of make_quality_sets.py (JSON lines) and their scorer, shared by rag_qa_bench
// and bench/dev/selective_recompute so that both read and score a question the same way.
#pragma once

#include <cctype>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/json.h"

namespace lazyrag::rag_qa {

// Lower-cased alphanumerics, every other run of characters one space, padded with a space at
// both ends (so that a find() matches whole words).
inline std::string Normalise(const std::string& s) {
  std::string out = " ";
  for (unsigned char c : s) {
    if (std::isalnum(c))
      out += char(std::tolower(c));
    else if (out.back() != ' ')
      out += ' ';
  }
  if (out.back() != ' ') out += ' ';
  return out;
}

// Contained exact match: the normalised output holds the normalised answer as whole words.
inline bool Correct(const std::string& output, const std::string& answer) {
  return Normalise(output).find(Normalise(answer)) != std::string::npos;
}

struct Question {
  int id = 0;
  std::vector<std::string> documents;
  std::string question, answer;
  std::vector<std::pair<int, int>> facts;  // (document, character offset of the fact)
  int depth = 0;                           // tokens, the deepest needed fact (set by the caller)
};

// The questions of a set file; lines that are not question objects are skipped.
inline std::vector<Question> LoadQuestions(const std::string& path) {
  std::vector<Question> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto v = ParseJson(line);
    if (!v.ok() || !v->is_object() || JsonMember(*v, "documents") == nullptr) continue;
    Question q;
    q.id = v->value("id", 0);
    for (const auto& d : v->at("documents")) q.documents.push_back(d.get<std::string>());
    q.question = v->value("question", "");
    q.answer = v->value("answer", "");
    if (const Json* fd = JsonMember(*v, "fact_doc")) {
      q.facts.push_back({fd->get<int>(), v->value("fact_char", 0)});
    }
    if (const Json* fs = JsonMember(*v, "facts")) {
      for (const auto& f : *fs) q.facts.push_back({f.value("doc", 0), f.value("char", 0)});
    }
    out.push_back(q);
  }
  return out;
}

}  // namespace lazyrag::rag_qa
