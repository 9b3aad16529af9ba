// qkernels::parallel_for(begin, end, grain, f): f(b, e) over sub-ranges of [begin, end) on the front-end's
// thread pool: torch's intra-op pool in the torch extension (torch::stable::parallel_for; setup.py compiles
// it with TORCH_TARGET_VERSION), the executor the XLA FFI handler installs for the calling thread in the
// JAX extension (csrc/jax/ffi_common.h: XLA's intra-op pool), or the calling thread alone when none is
// installed. The CPU kernels (csrc/cpu/*_kernels.h, *_impl.h) call only this: no torch, no XLA in them.
// Every kernel owns its outputs per task and reduces in a fixed order, so how the range is split does not
// change a result.
#pragma once

#include <algorithm>
#include <cstdint>

#ifdef TORCH_TARGET_VERSION
#include <torch/csrc/stable/ops.h>
#else
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#endif

namespace qkernels {

#ifdef TORCH_TARGET_VERSION

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  torch::stable::parallel_for(begin, end, grain, f);
}

#else

// A pool that runs tasks: the front-end's adapter (the XLA FFI thread pool).
struct Executor {
  virtual ~Executor() = default;
  virtual int64_t num_threads() const = 0;
  virtual void schedule(std::function<void()> task) = 0;
};

namespace detail {
inline Executor*& current_executor() {
  static thread_local Executor* executor = nullptr;
  return executor;
}
}  // namespace detail

// Installs an executor for parallel_for calls on this thread for its lifetime.
class ExecutorScope {
 public:
  explicit ExecutorScope(Executor* e) : saved_(detail::current_executor()) { detail::current_executor() = e; }
  ~ExecutorScope() { detail::current_executor() = saved_; }
  ExecutorScope(const ExecutorScope&) = delete;
  ExecutorScope& operator=(const ExecutorScope&) = delete;

 private:
  Executor* saved_;
};

// Chunks of at least `grain` elements, at most one per thread. The calling thread takes chunks too and waits
// only for chunks a pool thread has already started: no deadlock when every pool thread is busy (the caller
// may itself run on one), and a helper scheduled too late finds no chunk left and never touches f.
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  Executor* pool = detail::current_executor();
  const int64_t n = end - begin, g = std::max<int64_t>(grain, 1);
  const int64_t threads = pool != nullptr ? std::max<int64_t>(pool->num_threads(), 1) : 1;
  const int64_t chunks = std::min<int64_t>(threads, (n + g - 1) / g);
  if (chunks <= 1) {
    f(begin, end);
    return;
  }
  const int64_t step = (n + chunks - 1) / chunks;
  struct State {
    std::atomic<int64_t> next{0};
    int64_t done = 0;
    std::mutex mu;
    std::condition_variable cv;
  };
  auto state = std::make_shared<State>();
  const std::function<void(int64_t, int64_t)> body = [&f](int64_t b, int64_t e) { f(b, e); };
  const auto* body_ptr = &body;
  // run chunks until none is left; returns how many this thread ran
  auto work = [state, body_ptr, begin, end, step, chunks]() {
    int64_t ran = 0;
    for (int64_t c; (c = state->next.fetch_add(1)) < chunks; ++ran) {
      (*body_ptr)(begin + c * step, std::min(end, begin + (c + 1) * step));
    }
    if (ran > 0) {
      std::lock_guard<std::mutex> lock(state->mu);
      state->done += ran;
      state->cv.notify_all();
    }
  };
  for (int64_t t = 1; t < chunks; ++t) pool->schedule(work);
  work();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done == chunks; });
}

#endif

}  // namespace qkernels
