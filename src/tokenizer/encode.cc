// Encoding pipeline: added-token extraction -> normalizer -> pre-tokenizer ->
// BPE -> post-processor, mirroring the order and semantics of HF tokenizers
// (normalizers and pre-tokenizers: pretokenize.cc).
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "tokenizer/impl.h"

namespace ptllm::tok_detail {

// --------------------------------------------------------------------- BPE
namespace {
struct Symbol {
  int32_t id;
  int32_t prev, next;
  int32_t len;  // bytes covered; 0 marks a symbol merged into its left neighbour
};
struct Cand {
  int32_t rank, pos, merged;
};
// Min-heap on (rank, pos): lowest rank first, leftmost on ties (HF's order).
struct CandGreater {
  bool operator()(const Cand& x, const Cand& y) const {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  }
};
}  // namespace

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    const int32_t id = raw_bytes ? raw_map.find(word) : vocab_map.find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (split_marker.empty()) {
    tokenize_cached(word, out);
    return;
  }
  // Cut before every marker that follows a non-marker character (see
  // Bpe::split_marker for why this is exact).
  const std::string_view mk = split_marker;
  size_t seg = 0, pos = word.find(mk, 1);
  while (pos != std::string_view::npos) {
    const bool after_marker = pos >= mk.size() && word.compare(pos - mk.size(), mk.size(), mk) == 0;
    if (!after_marker) {
      tokenize_cached(word.substr(seg, pos - seg), out);
      seg = pos;
    }
    pos = word.find(mk, pos + mk.size());
  }
  tokenize_cached(word.substr(seg), out);
}

namespace {
// Small direct-mapped cache of recent words -> ids, per thread (so no locks),
// tagged with the model uid. Bounded: kCacheSlots entries of short words.
// It starts at kFirstSlots and doubles as it fills: at its full size it is
// ~1.2 MB, and made at once it cost every new thread ~5 ms of page faults on
// its first text (the server: each HTTP thread's first request; 16 at once
// delayed the first tokens of a burst by tens of ms).
constexpr size_t kCacheSlots = 16384, kFirstSlots = 64;
constexpr size_t kCacheMaxWord = 48;
struct CacheEntry {
  uint64_t uid = 0, hash = 0;  // uid 0: empty
  std::string word;
  std::vector<int32_t> ids;
};
struct WordCache {
  std::vector<CacheEntry> slots;
  size_t filled = 0;  // slots with an entry
  CacheEntry& slot(uint64_t h) {
    if (slots.empty()) slots.resize(kFirstSlots);
    return slots[size_t(h) & (slots.size() - 1)];
  }
  // Called after a miss was stored in a slot that was empty: past half full, double.
  void grew() {
    if (++filled * 2 <= slots.size() || slots.size() >= kCacheSlots) return;
    std::vector<CacheEntry> old(slots.size() * 2);
    old.swap(slots);
    filled = 0;
    for (CacheEntry& e : old)
      if (e.uid != 0) {
        CacheEntry& d = slots[size_t(e.hash) & (slots.size() - 1)];
        if (d.uid == 0) ++filled;
        d = std::move(e);
      }
  }
};
}  // namespace

void Bpe::tokenize_cached(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() > kCacheMaxWord) {
    tokenize_uncached(word, out);
    return;
  }
  thread_local WordCache cache;
  const uint64_t h = StrIdMap::hash(word);
  CacheEntry& e = cache.slot(h);
  if (e.uid == uid && e.hash == h && e.word == word) {
    out.insert(out.end(), e.ids.begin(), e.ids.end());
    return;
  }
  const size_t first = out.size();
  tokenize_uncached(word, out);
  const bool was_empty = e.uid == 0;
  e.uid = uid;
  e.hash = h;
  e.word.assign(word);
  e.ids.assign(out.begin() + std::ptrdiff_t(first), out.end());
  if (was_empty) cache.grew();  // may move the entries: `e` is not used after
}

void Bpe::tokenize_uncached(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Cand> heap;
  thread_local std::string tmp;
  sym.clear();
  auto add = [&](int32_t id, int32_t len) {
    const int32_t idx = int32_t(sym.size());
    sym.push_back({id, idx - 1, -1, len});
    if (idx > 0) sym[size_t(idx - 1)].next = idx;
  };
  const bool plain = continuing_subword_prefix.empty() && end_of_word_suffix.empty();
  int32_t unk_pending_len = 0;  // > 0 while an unk symbol waits to be emitted
  size_t i = 0;
  if (raw_bytes) {
    for (unsigned char c : word) add(byte_sym[c], 1);
    i = word.size();
  }
  while (i < word.size()) {
    const size_t b = i;
    const uint32_t cp = utf8_next(word, i);
    const int32_t len = int32_t(i - b);
    int32_t id = -1;
    std::string_view s = word.substr(b, size_t(len));
    if (plain && cp < cp_ids.size()) {
      id = cp_ids[cp];
    } else {
      if (!plain) {
        tmp.clear();
        if (b != 0) tmp += continuing_subword_prefix;
        tmp.append(s);
        if (i == word.size()) tmp += end_of_word_suffix;
        s = tmp;
      }
      id = vocab_map.find(s);
    }
    if (id >= 0) {
      if (unk_pending_len) {
        add(unk_id, unk_pending_len);
        unk_pending_len = 0;
      }
      add(id, len);
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (unsigned char c : s) all = all && byte_ids[c] >= 0;
      if (all) {
        // HF does not flush a pending unk here; keep its (odd) order.
        for (unsigned char c : s) add(byte_ids[c], 1);
        continue;
      }
    }
    if (unk_id >= 0) {
      if (unk_pending_len && !fuse_unk) add(unk_id, unk_pending_len), unk_pending_len = 0;
      unk_pending_len += len;
    }
    // No unk token: HF silently drops the character.
  }
  if (unk_pending_len) add(unk_id, unk_pending_len);

  if (sym.size() > 1) {
    heap.clear();
    int32_t rank, merged;
    for (size_t k = 0; k + 1 < sym.size(); ++k)
      if (merges.find(sym[k].id, sym[k + 1].id, &rank, &merged)) heap.push_back({rank, int32_t(k), merged});
    std::make_heap(heap.begin(), heap.end(), CandGreater{});
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), CandGreater{});
      const Cand top = heap.back();
      heap.pop_back();
      Symbol& left = sym[size_t(top.pos)];
      if (left.len == 0 || left.next < 0) continue;
      const int32_t rpos = left.next;
      Symbol& right = sym[size_t(rpos)];
      // Stale entry check exactly as HF: the pair now at `pos` must still
      // merge into the same token.
      if (!merges.find(left.id, right.id, &rank, &merged) || merged != top.merged) continue;
      left.id = top.merged;
      left.len += right.len;
      left.next = right.next;
      right.len = 0;
      if (right.next >= 0) sym[size_t(right.next)].prev = top.pos;
      if (left.prev >= 0 && merges.find(sym[size_t(left.prev)].id, left.id, &rank, &merged)) {
        heap.push_back({rank, left.prev, merged});
        std::push_heap(heap.begin(), heap.end(), CandGreater{});
      }
      if (left.next >= 0 && merges.find(left.id, sym[size_t(left.next)].id, &rank, &merged)) {
        heap.push_back({rank, top.pos, merged});
        std::push_heap(heap.begin(), heap.end(), CandGreater{});
      }
    }
  }
  for (const Symbol& s : sym)
    if (s.len) out.push_back(s.id);
}

// ------------------------------------------------------------ post-process
void PostProcessor::apply(std::vector<int32_t>& ids) const {
  switch (kind) {
    case Kind::None:
    case Kind::ByteLevel:  // only adjusts offsets, never ids
      break;
    case Kind::Sequence:
      for (auto& c : children) c.apply(ids);
      break;
    case Kind::Template:
    case Kind::Bert:
      if (!prefix.empty()) ids.insert(ids.begin(), prefix.begin(), prefix.end());
      ids.insert(ids.end(), suffix.begin(), suffix.end());
      break;
  }
}

// ------------------------------------------------------------------- encode
namespace {
struct Segment {
  std::string text;
  int32_t added = -1;  // index into Impl::added, or -1 for ordinary text
  bool at_origin = false;
};

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  size_t j = i;
  return is_word_char(utf8_next(s, j));
}
bool starts_with_word(std::string_view s) {
  size_t i = 0;
  return !s.empty() && is_word_char(utf8_next(s, i));
}

// HF AddedVocabulary::find_matches + split_with_indices.
void split_added(const Impl& t, const TokenTrie& trie, std::string text, bool at_origin, bool parse_special,
                 std::vector<Segment>& out) {
  if (text.empty()) return;
  if (trie.empty()) {
    out.push_back({std::move(text), -1, at_origin});
    return;
  }
  const std::string_view s = text;
  const size_t n = s.size();
  size_t start_offset = 0, pos = 0;
  auto plain = [&](size_t b, size_t e) { out.push_back({std::string(s.substr(b, e - b)), -1, at_origin && b == 0}); };
  while (pos < n) {
    if (!trie.may_start(static_cast<unsigned char>(s[pos]))) {
      ++pos;
      continue;
    }
    int32_t idx = -1;
    const size_t len = trie.longest_at(s, pos, &idx);
    if (!len) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + len;
    pos = stop;
    const AddedToken& tok = t.added[size_t(idx)];
    if (tok.special && !parse_special) continue;
    if (tok.single_word) {
      const bool start_space = start == 0 || !ends_with_word(s.substr(0, start));
      const bool stop_space = stop == n || !starts_with_word(s.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      // Start of the whitespace run that ends right before the token.
      size_t i = 0, run = start;
      while (i < start) {
        size_t j = i;
        const bool ws = is_white_space(utf8_next(s, j));
        if (ws && run == start) run = i;
        if (!ws) run = start;
        i = j;
      }
      start = std::max(run, start_offset);
    }
    if (tok.rstrip) {
      size_t i = stop;
      while (i < n) {
        size_t j = i;
        if (!is_white_space(utf8_next(s, j))) break;
        i = j;
      }
      stop = i;
    }
    if (start_offset < start) plain(start_offset, start);
    out.push_back({std::string(s.substr(start, stop - start)), idx, false});
    start_offset = stop;
  }
  if (start_offset != n) plain(start_offset, n);
}
}  // namespace

std::vector<int32_t> Impl::encode(std::string_view text, bool add_special, bool parse_special) const {
  if (llama) return llama->encode(*this, text, add_special, parse_special);
  size_t bad_at = 0;
  if (!utf8_valid(text, &bad_at) && !bpe.byte_fallback && !byte_level)
    fail("tokenizer input: invalid UTF-8 at byte offset {} (this tokenizer has neither byte fallback nor a "
         "byte-level alphabet, so such bytes cannot be encoded)",
         bad_at);

  // 1. Added tokens that match the raw text; 2. normalize what is left and
  // match the normalized added tokens in it.
  std::vector<Segment> raw, segs;
  split_added(*this, trie_raw, std::string(text), true, parse_special, raw);
  for (Segment& sg : raw) {
    if (sg.added >= 0) {
      segs.push_back(std::move(sg));
      continue;
    }
    if (normalizer) normalizer->apply(sg.text);
    split_added(*this, trie_normalized, std::move(sg.text), sg.at_origin, parse_special, segs);
  }

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (Segment& sg : segs) {
    if (sg.added >= 0) {
      ids.push_back(added[size_t(sg.added)].id);
      continue;
    }
    Piece whole{std::move(sg.text), sg.at_origin};
    if (pre_tokenizer) {
      auto to_model = [&](Piece& q) { bpe.tokenize(q.text, ids); };
      pre_tokenizer->run(whole, PieceSink(to_model));
    } else {
      bpe.tokenize(whole.text, ids);
    }
  }
  if (add_special) post.apply(ids);
  return ids;
}

}  // namespace ptllm::tok_detail
