// Reader for the Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens).
// Wall-clock timestamps are converted with a days-from-civil computation in integer 100 ns
// ticks (no locale or time-zone functions), so arrivals are exact and portable.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/text.h"
#include "traces/trace.h"

namespace duet::traces {
namespace {

constexpr std::string_view kHeader = "TIMESTAMP,ContextTokens,GeneratedTokens";
constexpr std::string_view kTimestampFormat = "YYYY-MM-DD HH:MM:SS.fffffff";
// Azure carries no prefix information; block_tokens is kept at the Mooncake value.
constexpr Tokens kAzureBlockTokens = 512;
constexpr std::int64_t kTicksPerSecond = 10'000'000;  // 7 fractional digits

Status LineError(const std::string& source, std::size_t line, const std::string& what) {
  return Status::Error(source + ":" + std::to_string(line) + ": " + what);
}

// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's civil algorithm,
// written out here): shifts the year to start in March so the leap day is the last day.
std::int64_t DaysFromCivil(std::int64_t year, int month, int day) {
  year -= month <= 2 ? 1 : 0;
  const std::int64_t era = (year >= 0 ? year : year - 399) / 400;
  const std::int64_t year_of_era = year - era * 400;                         // [0, 399]
  const int shifted_month = month > 2 ? month - 3 : month + 9;               // March = 0
  const std::int64_t day_of_year = (153 * shifted_month + 2) / 5 + day - 1;  // [0, 365]
  const std::int64_t day_of_era =
      year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;  // [0, 146096]
  return era * 146097 + day_of_era - 719468;
}

bool IsLeapYear(int year) { return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0; }

int DaysInMonth(int year, int month) {
  static constexpr int kDays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return month == 2 && IsLeapYear(year) ? 29 : kDays[month - 1];
}

// Reads exactly `count` decimal digits at text[pos]; false if any is not a digit.
bool ReadDigits(std::string_view text, std::size_t pos, std::size_t count, int& value) {
  if (pos + count > text.size()) return false;
  value = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const char c = text[pos + i];
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  return true;
}

// "YYYY-MM-DD HH:MM:SS[.f{0,7}]" to 100 ns ticks since the Unix epoch (UTC assumed; only
// differences are used, so the zone does not matter).
bool ParseTimestampTicks(std::string_view text, std::int64_t& ticks) {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (text.size() < 19) return false;
  if (!ReadDigits(text, 0, 4, year) || text[4] != '-' || !ReadDigits(text, 5, 2, month) ||
      text[7] != '-' || !ReadDigits(text, 8, 2, day) || text[10] != ' ' ||
      !ReadDigits(text, 11, 2, hour) || text[13] != ':' || !ReadDigits(text, 14, 2, minute) ||
      text[16] != ':' || !ReadDigits(text, 17, 2, second)) {
    return false;
  }
  if (month < 1 || month > 12 || day < 1 || day > DaysInMonth(year, month) || hour > 23 ||
      minute > 59 || second > 59) {
    return false;
  }
  std::int64_t fraction_ticks = 0;
  if (text.size() > 19) {
    if (text[19] != '.') return false;
    const std::string_view digits = text.substr(20);
    if (digits.size() > 7) return false;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
      fraction_ticks = fraction_ticks * 10 + (c - '0');
    }
    for (std::size_t i = digits.size(); i < 7; ++i) fraction_ticks *= 10;  // pad to 7 digits
  }
  const std::int64_t seconds =
      DaysFromCivil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second;
  ticks = seconds * kTicksPerSecond + fraction_ticks;
  return true;
}

// A token count in 1..kMaxRequestTokens, plain decimal digits only.
bool ParseTokens(std::string_view text, Tokens& value) {
  if (text.empty() || text.front() < '0' || text.front() > '9') return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size() && value >= 1 &&
         value <= kMaxRequestTokens;
}

std::string_view StripLineEnd(std::string_view text) {
  if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
  return text;
}

bool IsBlank(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

}  // namespace

Result<Trace> ParseAzure(std::istream& in, const std::string& source_name) {
  Trace trace;
  trace.source = source_name;
  trace.block_tokens = kAzureBlockTokens;
  std::vector<std::int64_t> ticks;  // per request, in file order (ids index it)
  std::vector<std::size_t> lines;   // the line of each request, for errors found at the end
  std::string raw;
  std::size_t line = 0;
  bool have_header = false;
  while (std::getline(in, raw)) {
    ++line;
    std::string_view text = StripLineEnd(raw);
    if (!have_header) {
      // Tolerate a UTF-8 byte order mark, which spreadsheet exports often add.
      if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
      if (text != kHeader) {
        return LineError(
            source_name, line,
            "bad header '" + Excerpt(text) + "' (expected '" + std::string(kHeader) + "')");
      }
      have_header = true;
      continue;
    }
    if (IsBlank(text)) continue;

    std::string_view columns[3];
    std::size_t count = 0;
    std::size_t start = 0;
    while (true) {
      const std::size_t comma = text.find(',', start);
      const std::string_view column = text.substr(
          start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
      if (count < 3) columns[count] = column;
      ++count;
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (count != 3) {
      return LineError(
          source_name, line,
          "expected 3 columns (" + std::string(kHeader) + "), got " + std::to_string(count));
    }

    TraceRequest request;
    request.id = trace.requests.size();
    std::int64_t row_ticks = 0;
    if (!ParseTimestampTicks(columns[0], row_ticks)) {
      return LineError(source_name, line,
                       "field 'TIMESTAMP' must look like '" + std::string(kTimestampFormat) +
                           "', got '" + Excerpt(columns[0]) + "'");
    }
    if (!ParseTokens(columns[1], request.input_tokens)) {
      return LineError(source_name, line,
                       "field 'ContextTokens' must be a positive integer (at most " +
                           std::to_string(kMaxRequestTokens) + "), got '" + Excerpt(columns[1]) +
                           "'");
    }
    if (!ParseTokens(columns[2], request.output_tokens)) {
      return LineError(source_name, line,
                       "field 'GeneratedTokens' must be a positive integer (at most " +
                           std::to_string(kMaxRequestTokens) + "), got '" + Excerpt(columns[2]) +
                           "'");
    }
    ticks.push_back(row_ticks);
    lines.push_back(line);
    trace.requests.push_back(std::move(request));
  }
  if (in.bad()) return Status::Error(source_name + ": read error");
  if (trace.requests.empty()) {
    return Status::Error(source_name + ": no requests" + (have_header ? "" : " (empty file)"));
  }
  // Arrivals are relative to the earliest row; in a time-ordered file (the real trace) that is
  // the first row, and it keeps arrivals non-negative if rows go backwards.
  const std::int64_t origin = *std::min_element(ticks.begin(), ticks.end());
  for (std::size_t i = 0; i < ticks.size(); ++i) {
    trace.requests[i].arrival_s =
        static_cast<double>(ticks[i] - origin) / static_cast<double>(kTicksPerSecond);
    if (trace.requests[i].arrival_s > kMaxArrivalS) {
      return LineError(source_name, lines[i],
                       "field 'TIMESTAMP' is more than 1e8 s (the trace horizon) after the "
                       "earliest row");
    }
  }
  std::stable_sort(
      trace.requests.begin(), trace.requests.end(),
      [](const TraceRequest& a, const TraceRequest& b) { return a.arrival_s < b.arrival_s; });
  return trace;
}

Result<Trace> ReadAzure(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open file");
  return ParseAzure(in, path);
}

}  // namespace duet::traces
