// Generated text with stop strings: decides what may be sent to the client
// now. Text that could be the start of a stop string is held back until the
// next token shows whether it is one; on a match, the text before the stop
// string is released and generation ends (OpenAI: the stop string itself is
// not returned).
#pragma once
#include <string>
#include <vector>

namespace ptllm::serve {

class StopText {
 public:
  explicit StopText(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Appends newly decoded text; returns the part that can be sent now.
  std::string push(const std::string& piece);
  // Generation ended for another reason: everything held back (minus a stop string) is released.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& text() const { return sent_text_; }  // everything released so far

 private:
  std::string release(size_t upto);
  std::vector<std::string> stops_;
  std::string all_;        // decoded text so far
  size_t sent_ = 0;        // all_[0, sent_) has been released
  std::string sent_text_;
  bool stopped_ = false;
};

}  // namespace ptllm::serve
