// PCRE2-backed Regex for pre-tokenization: compile with UTF + Unicode properties (so \s, \p{L}
// and (?i) behave as in Oniguruma), JIT when the platform has it, and iterate matches.
#include "backend/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "backend/tokenizer/unicode_util.h"

namespace duet::backend {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

// One match block per thread, reused by every pattern: only the whole-match offsets are read,
// so one pair is enough (pcre2_match then returns 0 for patterns with groups, still a match).
pcre2_match_data* ThreadMatchData() {
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create(1, nullptr));
  return data.get();
}

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  if (n < 0) return "PCRE2 error " + std::to_string(code);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<std::size_t>(n));
}

}  // namespace

Result<Regex> Regex::Compile(std::string_view pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // MATCH_INVALID_UTF lets subjects hold ill-formed UTF-8 (such bytes simply never match)
  // instead of failing the whole match; text handed to Encode is not guaranteed valid.
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return Status::Error(Pcre2Message(error_code) + " at offset " + std::to_string(error_offset));
  }
  // JIT is an optimization only: where it is unavailable pcre2_match interprets the pattern.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  auto holder = std::make_shared<Code>();
  holder->code = code;
  Regex regex;
  regex.code_ = std::move(holder);
  regex.pattern_ = std::string(pattern);
  return regex;
}

void Regex::FindAll(std::string_view text,
                    std::vector<std::pair<std::size_t, std::size_t>>* out) const {
  pcre2_match_data* data = ThreadMatchData();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t search_from = 0;
  std::size_t last_match_end = std::string::npos;
  while (search_from <= text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), search_from, 0, data, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The JIT's default stack is small; the interpreter uses the heap and can go deeper.
      rc = pcre2_match(code_->code, subject, text.size(), search_from, PCRE2_NO_JIT, data, nullptr);
    }
    if (rc < 0) return;  // no (further) match, or PCRE2 hit a resource limit
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const std::size_t start = ovector[0];
    const std::size_t end = ovector[1];
    if (start == end && last_match_end == end) {
      // An empty match where the last one ended: step over one character and search again.
      if (search_from >= text.size()) return;
      search_from += unicode::CharLengthAt(text, search_from);
      continue;
    }
    // \K can move a match's reported start; never let pieces overlap or run backwards.
    if (start < search_from || end < start || end > text.size()) return;
    out->emplace_back(start, end);
    search_from = end;
    last_match_end = end;
  }
}

}  // namespace duet::backend
