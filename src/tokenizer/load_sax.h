// SAX capture of model.vocab / model.merges for the tokenizer.json loader
// (load.cc); internal, included by load.cc only.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/core.h>

namespace ptllm::tok_detail {

using nlohmann::json;

// model.vocab and model.merges are >95% of a tokenizer.json (11 MB for
// Qwen3). Building them as a nlohmann DOM and then copying them out costs
// more than the rest of loading, so a SAX pass captures those two straight
// into flat vectors and builds an ordinary DOM for everything else.
struct RawModel {
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool has_vocab = false, has_merges = false;
  std::string bad;  // first structural problem seen, reported by the loader
};

class CaptureSax : public nlohmann::json_sax<json> {
 public:
  CaptureSax(json& root, RawModel& raw) : dom_(root, true), raw_(raw) {}

  bool null() override { return cap_ ? scalar_in_capture() : dom_.null(); }
  bool boolean(bool v) override { return cap_ ? scalar_in_capture() : dom_.boolean(v); }
  bool number_float(number_float_t v, const string_t& s) override {
    return cap_ ? scalar_in_capture() : dom_.number_float(v, s);
  }
  bool binary(binary_t& v) override { return cap_ ? scalar_in_capture() : dom_.binary(v); }
  bool number_integer(number_integer_t v) override { return cap_ ? vocab_id(v) : dom_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) override {
    return cap_ ? vocab_id(int64_t(std::min<number_unsigned_t>(v, uint64_t(1) << 40))) : dom_.number_unsigned(v);
  }
  bool string(string_t& v) override {
    if (!cap_) return dom_.string(v);
    if (cap_ == kMerges && started_ && depth_ == cap_depth_) {  // "a b" form
      const size_t sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos) {
        note(fmt::format("merge #{} '{}' is not of the form 'a b'", raw_.merges.size(), v));
        raw_.merges.emplace_back();
      } else {
        raw_.merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      }
      return true;
    }
    if (cap_ == kMerges && started_ && depth_ == cap_depth_ + 1) {  // [a, b] form
      pair_.push_back(std::move(v));
      return true;
    }
    return scalar_in_capture();
  }
  bool start_object(std::size_t n) override {
    ++depth_;
    if (cap_) return open_capture(kVocab);
    if (depth_ == 2 && root_key_ == "model") in_model_ = true;
    return dom_.start_object(n);
  }
  bool key(string_t& k) override {
    if (cap_) {
      key_ = std::move(k);
      return true;
    }
    if (depth_ == 1) root_key_ = k;
    if (depth_ == 2 && in_model_ && (k == "vocab" || k == "merges")) {
      cap_ = k == "vocab" ? kVocab : kMerges;
      started_ = false;
      (cap_ == kVocab ? raw_.has_vocab : raw_.has_merges) = true;
      return true;
    }
    return dom_.key(k);
  }
  bool end_object() override {
    if (cap_) return close_capture();
    if (depth_ == 2) in_model_ = false;
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) override {
    ++depth_;
    if (cap_) {
      if (!started_) return open_capture(kMerges);
      if (cap_ == kMerges && depth_ == cap_depth_ + 1) {
        pair_.clear();
        return true;
      }
      note("model.merges entries must be strings or [a, b] pairs");
      return true;
    }
    return dom_.start_array(n);
  }
  bool end_array() override {
    if (cap_) {
      if (cap_ == kMerges && depth_ == cap_depth_ + 1) {
        if (pair_.size() != 2) {
          note(fmt::format("merge #{} is not a pair [a, b]", raw_.merges.size()));
          raw_.merges.emplace_back();
        } else {
          raw_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
        }
      }
      return close_capture();
    }
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t pos, const std::string& tok, const nlohmann::detail::exception& e) override {
    return dom_.parse_error(pos, tok, e);
  }

 private:
  enum Cap { kNone = 0, kVocab, kMerges };
  bool open_capture(Cap expect) {
    if (!started_) {
      if (cap_ != expect) note(cap_ == kVocab ? "model.vocab must be an object" : "model.merges must be an array");
      started_ = true;
      cap_depth_ = depth_;
    } else if (!(cap_ == kMerges && depth_ == cap_depth_ + 1)) {
      note("unexpected nesting inside model.vocab / model.merges");
    }
    return true;
  }
  bool close_capture() {
    if (depth_ == cap_depth_) cap_ = kNone;
    --depth_;
    return true;
  }
  bool vocab_id(int64_t v) {
    if (cap_ == kVocab && started_ && depth_ == cap_depth_) {
      raw_.vocab.emplace_back(std::move(key_), v);
      return true;
    }
    return scalar_in_capture();
  }
  bool scalar_in_capture() {
    note(cap_ == kVocab ? "model.vocab values must be integer ids" : "model.merges has a non-string entry");
    if (!started_) cap_ = kNone;  // e.g. "vocab": null
    return true;
  }
  void note(std::string msg) {
    if (raw_.bad.empty()) raw_.bad = std::move(msg);
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  RawModel& raw_;
  int depth_ = 0, cap_depth_ = 0;
  Cap cap_ = kNone;
  bool started_ = false, in_model_ = false;
  std::string root_key_, key_;
  std::vector<std::string> pair_;
};

}  // namespace ptllm::tok_detail
