// Decoding pipeline, streaming detokenizer and the public Tokenizer facade.
#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/impl.h"

namespace ptllm {
namespace tok_detail {

namespace {
// "<0xHH>" -> byte value, or -1.
int parse_byte_piece(std::string_view s) {
  if (s.size() != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
  auto hex = [](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
  };
  const int hi = hex(s[3]), lo = hex(s[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::vector<uint32_t> to_cps(std::string_view s) {
  std::vector<uint32_t> cps;
  size_t i = 0;
  while (i < s.size()) cps.push_back(utf8_next(s, i));
  return cps;
}
}  // namespace

bool Decoder::has(Kind k) const {
  if (kind == k) return true;
  for (const auto& c : children)
    if (c.has(k)) return true;
  return false;
}

void Decoder::apply(std::vector<std::string>& tokens) const {
  switch (kind) {
    case Kind::Sequence:
      for (const auto& c : children) c.apply(tokens);
      break;
    case Kind::Replace:
      for (std::string& t : tokens) replace_matches(t, regex.get(), a, b);
      break;
    case Kind::ByteFallback: {
      // Runs of <0xHH> pieces become their bytes if those form valid UTF-8;
      // otherwise each byte becomes one U+FFFD (HF's rule, not lossy UTF-8).
      std::vector<std::string> out;
      out.reserve(tokens.size());
      std::string run;
      size_t run_len = 0;
      auto flush_run = [&] {
        if (!run_len) return;
        if (utf8_valid(run)) {
          out.push_back(run);
        } else {
          for (size_t k = 0; k < run_len; ++k) out.emplace_back("\xEF\xBF\xBD");
        }
        run.clear();
        run_len = 0;
      };
      for (std::string& t : tokens) {
        const int byte = parse_byte_piece(t);
        if (byte >= 0) {
          run.push_back(char(byte));
          ++run_len;
        } else {
          flush_run();
          out.push_back(std::move(t));
        }
      }
      flush_run();
      tokens.swap(out);
      break;
    }
    case Kind::Fuse: {
      std::string all;
      for (const auto& t : tokens) all += t;
      tokens.assign(1, std::move(all));
      break;
    }
    case Kind::Strip:
      for (std::string& t : tokens) {
        const std::vector<uint32_t> cps = to_cps(t);
        size_t b0 = 0, e0 = cps.size();
        for (size_t i = 0; i < start && i < cps.size() && cps[i] == uint32_t(strip_content); ++i) b0 = i + 1;
        for (size_t i = 0; i < stop && i < cps.size(); ++i) {
          const size_t idx = cps.size() - i - 1;
          if (cps[idx] != uint32_t(strip_content) || idx < b0) break;
          e0 = idx;
        }
        std::string out;
        for (size_t i = b0; i < e0; ++i) utf8_append(out, cps[i]);
        t.swap(out);
      }
      break;
    case Kind::ByteLevel: {
      // Map every character back to its byte; a token containing characters
      // outside the byte alphabet (e.g. an added token) contributes its raw
      // UTF-8 instead. The bytes are then read as lossy UTF-8.
      std::string bytes;
      for (const std::string& t : tokens) {
        const size_t mark = bytes.size();
        size_t i = 0;
        bool ok = true;
        while (i < t.size()) {
          const int b = byte_from_cp(utf8_next(t, i));
          if (b < 0) {
            ok = false;
            break;
          }
          bytes.push_back(char(b));
        }
        if (!ok) {
          bytes.resize(mark);
          bytes += t;
        }
      }
      std::string out;
      append_lossy(out, bytes);
      tokens.assign(1, std::move(out));
      break;
    }
    case Kind::Metaspace:
      for (size_t k = 0; k < tokens.size(); ++k) {
        std::string& t = tokens[k];
        if (a.empty()) continue;
        std::string out;
        size_t pos = 0;
        while (true) {
          const size_t hit = t.find(a, pos);
          out.append(t, pos, hit == std::string::npos ? std::string::npos : hit - pos);
          if (hit == std::string::npos) break;
          if (!(k == 0 && prepend_scheme != 2)) out.push_back(' ');
          pos = hit + a.size();
        }
        t.swap(out);
      }
      break;
  }
}

const std::string* Impl::piece(int32_t id) const {
  if (id < 0 || id >= vocab_size) return nullptr;
  const int32_t k = added_index[size_t(id)];
  if (k >= 0) return &added[size_t(k)].content;
  if (size_t(id) < bpe.vocab.size() && !bpe.vocab[size_t(id)].empty()) return &bpe.vocab[size_t(id)];
  return nullptr;
}

bool Impl::is_byte_piece(int32_t id) const {
  const std::string* p = piece(id);
  return p && parse_byte_piece(*p) >= 0;
}

std::string Impl::decode(std::span<const int32_t> ids, bool skip_special) const {
  if (llama) return llama->decode(*this, ids, skip_special);
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size) fail("tokenizer decode: token id {} is outside the vocabulary [0, {})", id, vocab_size);
    if (skipped(id, skip_special)) continue;
    const std::string* p = piece(id);
    if (p) tokens.push_back(*p);  // ids without a piece are skipped, as HF does
  }
  if (!decoder) {
    std::string out;
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (k) out.push_back(' ');
      out += tokens[k];
    }
    return out;
  }
  decoder->apply(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace tok_detail

// ------------------------------------------------------------------ facade
namespace {
std::string read_file(const std::string& path, bool required) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    if (required) fail("{}: cannot open tokenizer file", path);
    return {};
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

Tokenizer Tokenizer::from_file(const std::string& tokenizer_json_path) {
  const std::string text = read_file(tokenizer_json_path, true);
  const auto cfg_path = std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
  std::string cfg;
  if (std::filesystem::exists(cfg_path)) cfg = read_file(cfg_path.string(), true);
  return Tokenizer(tok_detail::load_impl(text, cfg, tokenizer_json_path));
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json) {
  return Tokenizer(tok_detail::load_impl(tokenizer_json, tokenizer_config_json, "tokenizer.json"));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens, bool parse_special) const {
  return impl_->encode(text, add_special_tokens, parse_special);
}

bool Tokenizer::is_gguf_vocab() const { return impl_->llama != nullptr; }

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}

std::string Tokenizer::id_to_piece(int32_t id) const {
  const std::string* p = impl_->piece(id);
  if (!p) fail("tokenizer: token id {} has no vocabulary entry (vocab size {})", id, impl_->vocab_size);
  return *p;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view piece) const {
  const int32_t k = impl_->added_map.find(piece);
  if (k >= 0) return impl_->added[size_t(k)].id;
  const int32_t v = impl_->bpe.vocab_map.find(piece);
  if (v >= 0) return v;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const { return impl_->skipped(id, true); }

// ------------------------------------------------------------ StreamDecoder
StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens, ByteRuns runs)
    : tok_(tok), skip_special_(skip_special_tokens), eager_(runs == ByteRuns::Eager) {}

size_t StreamDecoder::trailing_run(size_t end, std::string* bytes) const {
  const tok_detail::Impl& t = tok_.impl();
  size_t k = end;
  while (k > 0 && t.is_byte_piece(ids_[k - 1])) --k;
  if (bytes) {
    bytes->clear();
    for (size_t i = k; i < end; ++i) bytes->push_back(char(tok_detail::parse_byte_piece(*t.piece(ids_[i]))));
  }
  return end - k;
}

// ByteRuns::Eager, a byte piece just pushed: release the run's whole characters not yet sent.
std::string StreamDecoder::push_run_byte() {
  if (run_broken_) return {};
  std::string bytes;
  const size_t run = trailing_run(ids_.size(), &bytes);
  size_t whole = bytes.size();  // bytes of whole characters from the run's start
  bool truncated = false;       // the rest is a character's start: more bytes may complete it
  if (!tok_detail::utf8_valid(bytes, &whole, &truncated)) run_broken_ = !truncated;
  if (run_broken_ || whole <= run_sent_) return {};
  // One byte per piece: the ids up to the run's `whole`-th byte decode to its whole characters.
  std::string s = tok_.impl().decode(std::span<const int32_t>(ids_.data(), ids_.size() - run + whole), skip_special_);
  if (s.compare(0, prefix_.size(), prefix_) != 0) return {};  // defensive, as in push()
  std::string out = s.substr(prefix_.size());
  prefix_ = std::move(s);
  run_sent_ = whole;
  return out;
}

// ByteRuns::Eager: a run of `run` byte pieces, part of it sent, ends invalid (HF: U+FFFD for
// each of its bytes). The bytes not sent become U+FFFD each; with_next: the piece after the
// run (the last id) follows, with its text as decode() gives it after the run.
std::string StreamDecoder::end_broken_run(size_t run, bool with_next) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  std::string out;
  for (size_t i = run_sent_; i < run; ++i) out += kReplacement;
  if (with_next) {
    const tok_detail::Impl& t = tok_.impl();
    const size_t before = ids_.size() - 1 - run;  // ids ahead of the run
    const std::string head = t.decode(std::span<const int32_t>(ids_.data(), before), skip_special_);
    const std::string s = t.decode(ids_, skip_special_);
    std::string mid;
    for (size_t i = 0; i < run; ++i) mid += kReplacement;
    // decode(ids_) = the text before the run, one U+FFFD per run byte, then the next piece's.
    if (s.compare(0, head.size(), head) == 0 && s.compare(head.size(), mid.size(), mid) == 0)
      out += s.substr(head.size() + mid.size());
    ids_.erase(ids_.begin(), ids_.end() - 1);
    prefix_ = t.decode(ids_, skip_special_);
  } else {
    ids_.clear();
    prefix_.clear();
  }
  run_sent_ = 0;
  run_broken_ = false;
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  const tok_detail::Impl& t = tok_.impl();
  if (id < 0 || id >= t.vocab_size)
    fail("tokenizer stream decode: token id {} is outside the vocabulary [0, {})", id, t.vocab_size);
  // Skipped specials never reach the decoder chain, so they cannot change the
  // text of their neighbours: dropping them here is exact.
  if (t.skipped(id, skip_special_) || !t.piece(id)) return {};
  ids_.push_back(id);
  // Strip(stop > 0) edits the end of the text: nothing is final until flush.
  if (t.stream_unsafe_tail) return {};
  // ByteFallback decides valid-vs-U+FFFD per whole run of <0xHH> pieces, so a
  // run is only final once a non-byte piece follows it (ByteRuns, tokenizer.h).
  if (t.decoder && t.decoder->has(tok_detail::Decoder::Kind::ByteFallback)) {
    if (t.is_byte_piece(id)) return eager_ ? push_run_byte() : std::string{};
    if (run_sent_ > 0) {  // Eager: a run that sent some of its bytes ends here
      const size_t run = trailing_run(ids_.size() - 1, nullptr);
      if (run_broken_ || run_sent_ < run) return end_broken_run(run, true);
      run_sent_ = 0;  // valid as a whole: decode(ids_) extends prefix_, as below
    }
    run_broken_ = false;  // a run that broke with nothing sent ends here too (decode() settles it)
  }
  std::string s = t.decode(ids_, skip_special_);
  // A trailing U+FFFD may be an unfinished byte-level character: wait.
  if (s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0) return {};
  if (s.compare(0, prefix_.size(), prefix_) != 0) return {};  // defensive: keep context, flush() settles it
  std::string out = s.substr(prefix_.size());
  // Keep only the last token as context for the next step.
  ids_.erase(ids_.begin(), ids_.end() - 1);
  prefix_ = t.decode(ids_, skip_special_);
  return out;
}

std::string StreamDecoder::flush() {
  if (run_sent_ > 0) {  // Eager: the stream ends in a run that sent some of its bytes
    const size_t run = trailing_run(ids_.size(), nullptr);
    if (run_broken_ || run_sent_ < run) return end_broken_run(run, false);
  }
  run_sent_ = 0;
  run_broken_ = false;
  std::string out;
  if (!ids_.empty()) {
    std::string s = tok_.impl().decode(ids_, skip_special_);
    out = s.compare(0, prefix_.size(), prefix_) == 0 ? s.substr(prefix_.size()) : s;
  }
  ids_.clear();
  prefix_.clear();
  return out;
}

}  // namespace ptllm
