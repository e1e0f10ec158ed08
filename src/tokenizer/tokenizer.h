// Hugging Face `tokenizers`-compatible tokenizer (tokenizer.json loader, BPE
// encoder, decoder pipeline, streaming detokenizer).
//
// The goal is bit-exact agreement with the Rust `tokenizers` library for the
// components real LLM checkpoints use (Llama 2/Mistral SentencePiece-BPE with
// byte fallback; GPT-2/Llama 3/Qwen byte-level BPE). Anything outside the
// supported set is rejected at load time rather than silently mis-tokenized.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ptllm {

namespace tok_detail {
struct Impl;
}
struct GgufVocab;

class Tokenizer {
 public:
  // Loads tokenizer.json; also reads tokenizer_config.json in the same folder
  // if present (add_bos_token / add_eos_token / bos_token / eos_token).
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  // Same from in-memory JSON text (e.g. a tokenizer embedded in a .tinygpt);
  // the config may be empty.
  static Tokenizer from_json(std::string_view tokenizer_json,
                             std::string_view tokenizer_config_json = {});

  // Encodes `text`. Added/special tokens that literally appear in the text are
  // always recognised (as HF does); add_special_tokens only controls the
  // post-processor (e.g. the BOS of a TemplateProcessing).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // parse_special = false: special tokens written in the text are encoded as
  // ordinary text (llama.cpp's parse_special; HF's encode_special_tokens).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens, bool parse_special) const;
  // Decodes ids through the tokenizer's decoder pipeline. Ids outside
  // [0, vocab_size()) throw ptllm::Error.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const;

  std::string id_to_piece(int32_t id) const;  // raw vocab string (throws if unknown)
  // max id + 1 over the model vocabulary and the added tokens (the size an
  // embedding table must have).
  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> token_to_id(std::string_view piece) const;

  // Extra helpers (not part of the required interface).
  bool is_special(int32_t id) const;  // added token flagged "special"
  // Built from GGUF tokenizer.ggml.* metadata (gguf_vocab.h): llama.cpp's
  // encoding rules rather than the HF pipeline.
  bool is_gguf_vocab() const;
  const tok_detail::Impl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::shared_ptr<const tok_detail::Impl> impl) : impl_(std::move(impl)) {}
  friend Tokenizer tokenizer_from_gguf_vocab(const GgufVocab& v, const std::string& where);
  // Immutable after construction, so copies/moves are cheap and the object can
  // be shared across threads.
  std::shared_ptr<const tok_detail::Impl> impl_;
};

// How StreamDecoder releases a run of byte-fallback pieces ("<0x0A>", "<0xE2>", ...).
// HF's ByteFallback decodes a whole run at once: valid UTF-8 as text, else one U+FFFD
// per byte of it, so a run is final only when a non-byte piece (or the end) follows it.
//  Whole: hold the run until then; push() + flush() == decode() always. A newline
//    (Llama 2 / Mistral vocabularies: "<0x0A>") waits for the next token.
//  Eager: release the run's bytes as soon as they form whole characters, as llama-server
//    (validate_utf8) and vLLM's incremental detokenizer do, so a newline goes out at
//    its own step. Equal to decode() unless a run is invalid as a whole after some of
//    it went out: there the stream keeps the characters it sent and gives U+FFFD for
//    each byte after them, where decode() gives U+FFFD for every byte of the run.
enum class ByteRuns { Whole, Eager };

// Incremental detokenizer for streaming: push ids one at a time; returns only
// newly completed text (never half a UTF-8 character); the concatenation of
// all push() results + flush() == tokenizer.decode(all ids, skip_special)
// (ByteRuns::Eager: except as said above).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = true, ByteRuns runs = ByteRuns::Whole);
  std::string push(int32_t id);
  // Emits whatever is still held back (e.g. an unfinished byte sequence) and
  // resets the decoder for a new stream.
  std::string flush();

 private:
  Tokenizer tok_;
  bool skip_special_;
  // Window of ids still needed for context: ids_[0] is the last token whose
  // text was already emitted (so decoders that treat the first token specially,
  // like Strip/Metaspace, see the same context), followed by pending ids.
  std::vector<int32_t> ids_;
  std::string prefix_;  // the part of decode(ids_) already returned
  // ByteRuns::Eager: of the byte-piece run at the end of ids_, how many bytes went out
  // (prefix_ then ends with them), and whether the run can no longer be valid UTF-8.
  bool eager_;
  size_t run_sent_ = 0;
  bool run_broken_ = false;
  size_t trailing_run(size_t end, std::string* bytes) const;  // byte pieces before ids_[end]
  std::string push_run_byte();
  std::string end_broken_run(size_t run, bool with_next);
};

}  // namespace ptllm
