// UTF-8 validation and lossy conversion, the GPT-2 byte-level alphabet, whitespace classes and
// NFC normalization (tables generated from Python's unicodedata into nfc_tables.inc).
#include "backend/tokenizer/unicode_util.h"

#include <algorithm>
#include <vector>

namespace duet::backend::unicode {
namespace {

struct CccRange {
  char32_t first, last;
  std::uint8_t ccc;
};
struct Decomposition {
  char32_t cp, first, second;  // second == 0 for a singleton decomposition
};
struct Composition {
  char32_t first, second, composite;
};

#include "backend/tokenizer/nfc_tables.inc"

// Hangul syllables are (de)composed arithmetically (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// Length of the sequence a lead byte starts and the allowed range of the second byte; len 0
// for bytes that cannot start a sequence.
struct LeadInfo {
  int len;
  unsigned char lo, hi;
};
LeadInfo Lead(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // at most U+10FFFF
  return {0, 0, 0};
}

// Outcome of looking at the bytes from `pos`: a valid sequence of `len` bytes, an ill-formed
// subpart of `len` bytes, or an incomplete (so far valid) sequence running to the end.
enum class Scan { kValid, kInvalid, kIncomplete };
Scan ScanAt(std::string_view s, std::size_t pos, std::size_t* len) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  const LeadInfo lead = Lead(b0);
  if (lead.len == 0) {
    *len = 1;
    return Scan::kInvalid;
  }
  for (int k = 1; k < lead.len; ++k) {
    if (pos + k >= s.size()) {
      *len = s.size() - pos;
      return Scan::kIncomplete;
    }
    const auto b = static_cast<unsigned char>(s[pos + k]);
    const unsigned char lo = k == 1 ? lead.lo : 0x80;
    const unsigned char hi = k == 1 ? lead.hi : 0xBF;
    if (b < lo || b > hi) {
      *len = k;
      return Scan::kInvalid;
    }
  }
  *len = lead.len;
  return Scan::kValid;
}

std::uint8_t Ccc(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = std::end(kCccRanges);
  const auto* it = std::upper_bound(std::begin(kCccRanges), end, cp,
                                    [](char32_t c, const CccRange& r) { return c < r.first; });
  if (it == std::begin(kCccRanges)) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

const Decomposition* FindDecomposition(char32_t cp) {
  const auto* end = std::end(kDecompositions);
  const auto* it = std::lower_bound(std::begin(kDecompositions), end, cp,
                                    [](const Decomposition& d, char32_t c) { return d.cp < c; });
  return (it != end && it->cp == cp) ? it : nullptr;
}

void DecomposeInto(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* d = FindDecomposition(cp);
  if (d == nullptr) {
    out->push_back(cp);
    return;
  }
  DecomposeInto(d->first, out);
  if (d->second != 0) DecomposeInto(d->second, out);
}

// The primary composite of (first, second), or 0 when there is none.
char32_t Compose(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  const auto* end = std::end(kCompositions);
  const auto* it = std::lower_bound(std::begin(kCompositions), end, std::pair(first, second),
                                    [](const Composition& c, std::pair<char32_t, char32_t> key) {
                                      return std::pair(c.first, c.second) < key;
                                    });
  return (it != end && it->first == first && it->second == second) ? it->composite : 0;
}

// NFC of a run of valid code points, appended to `out` as UTF-8.
void NfcRun(const std::vector<char32_t>& input, std::string* out) {
  std::vector<char32_t> decomposed;
  decomposed.reserve(input.size() + 8);
  for (char32_t cp : input) DecomposeInto(cp, &decomposed);
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (std::size_t i = 1; i < decomposed.size(); ++i) {
    const std::uint8_t c = Ccc(decomposed[i]);
    if (c == 0) continue;
    std::size_t j = i;
    while (j > 0 && Ccc(decomposed[j - 1]) > c) {
      std::swap(decomposed[j - 1], decomposed[j]);
      --j;
    }
  }
  // Canonical composition: a character composes with the last starter unless blocked by a
  // character in between whose class is 0 or not lower than its own.
  std::vector<char32_t> composed;
  composed.reserve(decomposed.size());
  std::ptrdiff_t starter = -1;
  int last_ccc = -1;  // -1: nothing appended since the starter
  for (char32_t cp : decomposed) {
    const int ccc = Ccc(cp);
    if (starter >= 0 && (last_ccc == -1 || (last_ccc != 0 && last_ccc < ccc))) {
      const char32_t composite = Compose(composed[starter], cp);
      if (composite != 0) {
        composed[starter] = composite;
        continue;
      }
    }
    if (ccc == 0) {
      starter = static_cast<std::ptrdiff_t>(composed.size());
      last_ccc = -1;
    } else {
      last_ccc = ccc;
    }
    composed.push_back(cp);
  }
  for (char32_t cp : composed) AppendUtf8(cp, out);
}

}  // namespace

bool IsValidUtf8(std::string_view bytes) {
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    std::size_t len = 0;
    if (ScanAt(bytes, pos, &len) != Scan::kValid) return false;
    pos += len;
  }
  return true;
}

std::size_t AppendLossyUtf8(std::string_view bytes, bool final, std::string* out) {
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    std::size_t len = 0;
    switch (ScanAt(bytes, pos, &len)) {
      case Scan::kValid:
        out->append(bytes.substr(pos, len));
        break;
      case Scan::kInvalid:
        out->append(kReplacementChar);
        break;
      case Scan::kIncomplete:
        if (!final) return pos;
        out->append(kReplacementChar);
        break;
    }
    pos += len;
  }
  return pos;
}

std::string LossyUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  AppendLossyUtf8(bytes, /*final=*/true, &out);
  return out;
}

std::size_t DecodeUtf8(std::string_view bytes, std::size_t pos, char32_t* cp) {
  std::size_t len = 0;
  if (pos >= bytes.size() || ScanAt(bytes, pos, &len) != Scan::kValid) return 0;
  const auto b0 = static_cast<unsigned char>(bytes[pos]);
  char32_t value =
      len == 1 ? b0 : (len == 2 ? (b0 & 0x1F) : (len == 3 ? (b0 & 0x0F) : (b0 & 0x07)));
  for (std::size_t k = 1; k < len; ++k) {
    value = (value << 6) | (static_cast<unsigned char>(bytes[pos + k]) & 0x3F);
  }
  *cp = value;
  return len;
}

std::size_t CharLengthAt(std::string_view bytes, std::size_t pos) {
  std::size_t len = 0;
  return ScanAt(bytes, pos, &len) == Scan::kValid ? len : 1;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsUnicodeWhitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool IsPythonSpace(char32_t cp) { return IsUnicodeWhitespace(cp) || (cp >= 0x1C && cp <= 0x1F); }

const std::array<std::string, 256>& ByteLevelAlphabet() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      AppendUtf8(printable ? static_cast<char32_t>(b) : next++, &t[b]);
    }
    return t;
  }();
  return table;
}

int ByteLevelCharToByte(char32_t cp) {
  // The alphabet's code points all lie below U+0144.
  static const std::array<int, 0x144> reverse = [] {
    std::array<int, 0x144> r;
    r.fill(-1);
    const auto& alphabet = ByteLevelAlphabet();
    for (int b = 0; b < 256; ++b) {
      char32_t cp = 0;
      DecodeUtf8(alphabet[b], 0, &cp);
      r[cp] = b;
    }
    return r;
  }();
  return cp < reverse.size() ? reverse[cp] : -1;
}

std::string NfcNormalize(std::string_view text) {
  // Fast path: text whose code points are all below U+0300 is already NFC (nothing there
  // decomposes into, or composes with, what follows).
  bool simple = true;
  for (std::size_t pos = 0; pos < text.size() && simple; ++pos) {
    const auto b = static_cast<unsigned char>(text[pos]);
    if (b >= 0xCC) simple = false;  // lead bytes of U+0300 and above (and invalid bytes)
  }
  if (simple) return std::string(text);

  std::string out;
  out.reserve(text.size() + 16);
  std::vector<char32_t> run;
  std::size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp = 0;
    const std::size_t len = DecodeUtf8(text, pos, &cp);
    if (len == 0) {
      // An ill-formed byte: normalize what came before and keep the byte as it is.
      NfcRun(run, &out);
      run.clear();
      out.push_back(text[pos]);
      ++pos;
      continue;
    }
    run.push_back(cp);
    pos += len;
  }
  NfcRun(run, &out);
  return out;
}

}  // namespace duet::backend::unicode
