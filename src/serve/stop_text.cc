#include "serve/stop_text.h"

#include <algorithm>

namespace ptllm::serve {

std::string StopText::release(size_t upto) {
  std::string out = all_.substr(sent_, upto - sent_);
  sent_ = upto;
  sent_text_ += out;
  return out;
}

std::string StopText::push(const std::string& piece) {
  if (stopped_) return {};
  all_ += piece;
  // Earliest stop string that now occurs; a match may start inside text held back.
  size_t hit = std::string::npos;
  for (const auto& s : stops_) {
    const size_t from = sent_ > s.size() ? sent_ - s.size() : 0;
    const size_t p = all_.find(s, from);
    if (p != std::string::npos && p >= sent_) hit = std::min(hit, p);
  }
  if (hit != std::string::npos) {
    stopped_ = true;
    return release(hit);
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(s.size() - 1, all_.size() - sent_); k > hold; --k)
      if (all_.compare(all_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  return release(all_.size() - hold);
}

std::string StopText::flush() {
  if (stopped_) return {};
  return release(all_.size());
}

}  // namespace ptllm::serve
