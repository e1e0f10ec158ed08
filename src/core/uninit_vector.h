// A std::vector whose resize / size constructor leaves new elements of a
// trivial type uninitialised, so a large buffer's pages are not written (and
// so not faulted in) until they are used. For KV cache storage: a cache is
// sized for its capacity when it is made, but only the rows it has stored are
// ever read, so zeroing all of it up front costs a page fault per 4 KiB at
// once (an unbounded fp32 cache of flagship-27m: 12 MiB, ~3,000 faults) where
// filling it row by row spreads them over the generation.
#pragma once
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace ptllm {

template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
  using std::allocator<T>::allocator;
  template <typename U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  template <typename U>
  void construct(U* p) noexcept(noexcept(::new (static_cast<void*>(p)) U)) {
    ::new (static_cast<void*>(p)) U;  // default-initialised: no write for trivial U
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
using uninit_vector = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace ptllm
