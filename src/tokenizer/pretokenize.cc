// Normalizers and pre-tokenizers of the HF pipeline (see encode.cc for the
// order of the stages).
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "tokenizer/impl.h"

namespace ptllm::tok_detail {

namespace {

// (start, end, is_match) covering the whole string, like HF's Pattern::find_matches.
struct Span {
  size_t b, e;
  bool match;
};

void spans_from_matches(size_t n, const std::vector<std::pair<size_t, size_t>>& m, std::vector<Span>& out) {
  out.clear();
  size_t prev = 0;
  for (auto [b, e] : m) {
    if (prev != b) out.push_back({prev, b, false});
    out.push_back({b, e, true});
    prev = e;
  }
  if (prev != n) out.push_back({prev, n, false});
}

// Every character satisfying `pred` is its own match (HF's `Fn(char) -> bool` pattern).
template <typename Pred>
void spans_from_chars(std::string_view s, Pred&& pred, std::vector<Span>& out) {
  out.clear();
  size_t last = 0, i = 0;
  while (i < s.size()) {
    const size_t b = i;
    const uint32_t cp = utf8_next(s, i);
    if (pred(cp)) {
      if (last < b) out.push_back({last, b, false});
      out.push_back({b, i, true});
      last = i;
    }
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
}

void literal_matches(std::string_view s, std::string_view lit, std::vector<std::pair<size_t, size_t>>& out) {
  if (lit.empty()) return;
  size_t pos = s.find(lit);
  while (pos != std::string_view::npos) {
    out.emplace_back(pos, pos + lit.size());
    pos = s.find(lit, pos + lit.size());
  }
}

// Applies a SplitDelimiterBehavior to `spans` and appends the non-empty pieces.
void emit_split(const Piece& p, std::vector<Span>& spans, SplitBehavior behavior, bool invert,
                std::vector<Piece>& out) {
  if (invert)
    for (auto& s : spans) s.match = !s.match;
  std::vector<Span> res;
  res.reserve(spans.size());
  switch (behavior) {
    case SplitBehavior::Removed:
      for (auto& s : spans)
        if (!s.match) res.push_back(s);
      break;
    case SplitBehavior::Isolated:
      res = spans;
      break;
    case SplitBehavior::MergedWithPrevious: {
      bool prev_match = false;
      for (auto& s : spans) {
        if (s.match && !prev_match && !res.empty())
          res.back().e = s.e;
        else
          res.push_back(s);
        prev_match = s.match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool prev_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.match && !prev_match && !res.empty())
          res.back().b = s.b;
        else
          res.push_back(s);
        prev_match = s.match;
      }
      std::reverse(res.begin(), res.end());
      break;
    }
    case SplitBehavior::Contiguous: {
      bool prev_match = false;
      for (auto& s : spans) {
        if (s.match == prev_match && !res.empty())
          res.back().e = s.e;
        else
          res.push_back(s);
        prev_match = s.match;
      }
      break;
    }
  }
  for (auto& s : res) {
    if (s.e <= s.b) continue;
    out.push_back(Piece{p.text.substr(s.b, s.e - s.b), p.at_origin && s.b == 0});
  }
}

std::string to_byte_level(std::string_view s) {
  const uint32_t* map = byte_to_cp();
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) utf8_append(out, map[c]);
  return out;
}

}  // namespace

// --------------------------------------------------------------- normalizer
void Normalizer::apply(std::string& s) const {
  switch (kind) {
    case Kind::Sequence:
      for (auto& c : children) c.apply(s);
      break;
    case Kind::Prepend:
      if (!s.empty()) s.insert(0, a);
      break;
    case Kind::Replace:
      replace_matches(s, regex.get(), a, b);
      break;
    case Kind::Unicode:
      s = unicode_normalize(s, form);
      break;
    case Kind::Lowercase:
      s = unicode_lowercase(s);
      break;
    case Kind::Strip: {
      size_t b0 = 0, e0 = s.size();
      if (left) {
        size_t i = 0;
        while (i < s.size()) {
          size_t j = i;
          if (!is_white_space(utf8_next(s, j))) break;
          i = j;
        }
        b0 = i;
      }
      if (right) {
        // Walk forward remembering where the trailing whitespace run starts.
        size_t i = b0, run = std::string::npos;
        while (i < s.size()) {
          size_t j = i;
          const bool ws = is_white_space(utf8_next(s, j));
          if (ws && run == std::string::npos) run = i;
          if (!ws) run = std::string::npos;
          i = j;
        }
        if (run != std::string::npos) e0 = run;
      }
      s = s.substr(b0, e0 - b0);
      break;
    }
  }
}

// ------------------------------------------------------------ pre-tokenizer
namespace {
// Streams the split of `p` by regex/literal matches for the behaviors that
// need no look-around (Isolated, Removed), avoiding multi-megabyte span lists
// when a whole book is one segment.
template <typename ForEachMatch>
void stream_split(Piece& p, ForEachMatch&& for_each_match, SplitBehavior behavior, bool invert, bool byte_level,
                  PieceSink sink) {
  const std::string& s = p.text;
  Piece q;
  auto emit = [&](size_t b, size_t e, bool match) {
    if (invert) match = !match;
    if (behavior == SplitBehavior::Removed && match) return;
    q.text = byte_level ? to_byte_level(std::string_view(s).substr(b, e - b)) : s.substr(b, e - b);
    q.at_origin = p.at_origin && b == 0;
    sink(q);
  };
  size_t prev = 0;
  for_each_match([&](size_t b, size_t e) {
    if (prev != b) emit(prev, b, false);
    emit(b, e, true);
    prev = e;
  });
  if (prev != s.size()) emit(prev, s.size(), false);
}
}  // namespace

void PreTokenizer::run_from(size_t stage, Piece& p, PieceSink sink) const {
  if (stage == children.size()) {
    sink(p);
    return;
  }
  auto next = [&](Piece& q) { run_from(stage + 1, q, sink); };
  children[stage].run(p, PieceSink(next));
}

void PreTokenizer::run(Piece& p, PieceSink sink) const {
  if (p.text.empty()) return;
  std::vector<std::pair<size_t, size_t>> m;
  std::vector<Span> spans;
  std::vector<Piece> out;
  switch (kind) {
    case Kind::Sequence:
      run_from(0, p, sink);
      return;
    case Kind::Split:
      if (behavior == SplitBehavior::Isolated || behavior == SplitBehavior::Removed) {
        if (regex) {
          stream_split(p, [&](auto&& f) { regex->for_each(p.text, f); }, behavior, invert, false, sink);
        } else {
          stream_split(
              p,
              [&](auto&& f) {
                if (literal.empty()) return;
                for (size_t pos = p.text.find(literal); pos != std::string::npos;
                     pos = p.text.find(literal, pos + literal.size()))
                  f(pos, pos + literal.size());
              },
              behavior, invert, false, sink);
        }
        return;
      }
      if (regex)
        regex->find_all(p.text, m);
      else
        literal_matches(p.text, literal, m);
      spans_from_matches(p.text.size(), m, spans);
      emit_split(p, spans, behavior, invert, out);
      break;
    case Kind::ByteLevel:
      // (Assigning instead of insert(0, ...) also dodges a GCC 12 -Wrestrict false positive.)
      if (add_prefix_space && p.text[0] != ' ') p.text = " " + p.text;
      if (regex) {
        stream_split(p, [&](auto&& f) { regex->for_each(p.text, f); }, SplitBehavior::Isolated, false,
                     !defer_mapping, sink);
      } else if (defer_mapping) {
        sink(p);
      } else {
        Piece q{to_byte_level(p.text), p.at_origin};
        sink(q);
      }
      return;
    case Kind::Digits:
      spans_from_chars(p.text, [](uint32_t cp) { return is_numeric(cp); }, spans);
      emit_split(p, spans, individual_digits ? SplitBehavior::Isolated : SplitBehavior::Contiguous, false, out);
      break;
    case Kind::Metaspace: {
      replace_matches(p.text, nullptr, " ", replacement);
      const bool starts = p.text.compare(0, replacement.size(), replacement) == 0;
      if (!starts && (prepend_scheme == 0 || (prepend_scheme == 1 && p.at_origin))) p.text = replacement + p.text;
      if (!split) {
        sink(p);
        return;
      }
      literal_matches(p.text, replacement, m);  // one match per replacement char
      spans_from_matches(p.text.size(), m, spans);
      emit_split(p, spans, SplitBehavior::MergedWithNext, false, out);
      break;
    }
    case Kind::WhitespaceSplit:
      spans_from_chars(p.text, [](uint32_t cp) { return is_white_space(cp); }, spans);
      emit_split(p, spans, SplitBehavior::Removed, false, out);
      break;
    case Kind::Whitespace:
      regex->find_all(p.text, m);
      spans_from_matches(p.text.size(), m, spans);
      emit_split(p, spans, SplitBehavior::Removed, true, out);
      break;
  }
  for (Piece& q : out) sink(q);
}

void PreTokenizer::apply(std::vector<Piece>& pieces) const {
  std::vector<Piece> out;
  auto collect = [&](Piece& q) { out.push_back(q); };
  for (Piece& p : pieces) run(p, PieceSink(collect));
  pieces.swap(out);
}

}  // namespace ptllm::tok_detail
