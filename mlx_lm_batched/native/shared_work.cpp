/* Chunks of a kernel shared by the calling thread and helper threads that need not all
 * arrive (shared_work.h).
 *
 * OpenMP's parallel for ends in a barrier that every thread of the team must reach. A
 * decode step opens over a hundred such regions microseconds apart (one per matmul), and
 * a helper that has gone to sleep between them (after libgomp's brief spin, which keeps
 * shared cores free, see _native_build.py) must be woken first and then reach the
 * barrier: on a 2-core virtual machine both wake-ups sit on the step's critical path, and
 * a batch-1 step of SmolLM2 ran no faster on two threads than on one. Here the calling
 * thread starts on the chunks at once, helpers join as they wake and take chunks from one
 * atomic counter, and the caller waits only for chunks already taken; a helper that
 * wakes after the last chunk was taken finds nothing to do and sleeps again.
 *
 * The job and its counter: `limit` holds (job << 32 | chunks), `next` (job << 32 | next
 * chunk index), both rewritten per job. A taken chunk counts only if its job is the
 * current one and its index below the count; a job is replaced only after all its
 * chunks are done, so a helper holding a valid chunk reads a job that stays in place.
 */
#include "shared_work.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MLXLMB_PAUSE() _mm_pause()
#else
#define MLXLMB_PAUSE() std::this_thread::yield()
#endif

namespace mlxlmb {

namespace {

/* How long a helper spins for the next job before it sleeps. The caller never waits for
 * a sleeping helper, so this only decides how often a helper is awake to share a job:
 * 5, 20 and 50 us came out alike for one process decoding one row of SmolLM2's Q4_1 and
 * for two processes on the 2 cores of an AMD EPYC VM; 200 us took 1.3x the time with two
 * processes. */
constexpr auto HELPER_SPIN = std::chrono::microseconds(20);
constexpr uint64_t LOW = 0xffffffffu;

struct Helpers {
  std::atomic<uint64_t> next{0}, limit{0};
  std::atomic<uint32_t> posted{0};  // bumped per job: what a sleeping helper waits on
  std::atomic<int> done{0};          // chunks the helpers finished in the current job
  void (*fn)(void*, int) = nullptr;
  void* ctx = nullptr;
  std::atomic<int> wanted{0};  // helpers the current job may use (the first `wanted`)
  uint32_t job = 0;
  int started = 0;
  std::mutex busy;  // one job at a time (another CPU stream's kernel runs alone)

  /* Take chunks of the current job until none is left; returns how many were done. */
  int work() {
    int count = 0;
    for (;;) {
      const uint64_t taken = next.fetch_add(1, std::memory_order_acq_rel);
      const uint64_t lim = limit.load(std::memory_order_acquire);
      if ((taken >> 32) != (lim >> 32) || (taken & LOW) >= (lim & LOW)) return count;
      fn(ctx, static_cast<int>(taken & LOW));
      count++;
    }
  }

  void helper(int index) {
    uint32_t seen = posted.load(std::memory_order_acquire);
    for (;;) {
      const auto start = std::chrono::steady_clock::now();
      while (posted.load(std::memory_order_acquire) == seen &&
             std::chrono::steady_clock::now() - start < HELPER_SPIN)
        MLXLMB_PAUSE();
      posted.wait(seen, std::memory_order_acquire);  // returns at once if it moved
      seen = posted.load(std::memory_order_acquire);
      if (index >= wanted.load(std::memory_order_acquire)) continue;
      const int count = work();
      if (count) done.fetch_add(count, std::memory_order_release);
    }
  }

  /* False (nothing done) while another thread's job runs. */
  bool run(int chunks, int threads, void (*f)(void*, int), void* c) {
    std::unique_lock<std::mutex> alone(busy, std::try_to_lock);
    if (!alone.owns_lock()) return false;
    for (; started < threads - 1; started++)  // helpers live for the process
      std::thread([this, index = started] { helper(index); }).detach();
    fn = f;
    ctx = c;
    wanted.store(threads - 1, std::memory_order_relaxed);
    done.store(0, std::memory_order_relaxed);
    job++;
    limit.store((static_cast<uint64_t>(job) << 32) | static_cast<uint32_t>(chunks),
                std::memory_order_release);
    next.store(static_cast<uint64_t>(job) << 32, std::memory_order_release);
    posted.fetch_add(1, std::memory_order_release);
    posted.notify_all();
    const int mine = work();
    while (done.load(std::memory_order_acquire) + mine < chunks) MLXLMB_PAUSE();
    return true;
  }
};

Helpers& helpers() {
  static Helpers* shared = new Helpers();  // never destroyed: its threads are detached
  return *shared;
}

std::atomic<bool> enabled{true};

}  // namespace

bool shared_work_enabled() { return enabled.load(std::memory_order_relaxed); }
void set_shared_work_enabled(bool on) { enabled.store(on, std::memory_order_relaxed); }

void share_chunks(int chunks, int threads, void (*fn)(void*, int), void* ctx) {
  if (threads <= 1 || chunks <= 1) {
    for (int i = 0; i < chunks; i++) fn(ctx, i);
    return;
  }
  if (!shared_work_enabled()) {
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int i = 0; i < chunks; i++) fn(ctx, i);
    return;
  }
  if (!helpers().run(chunks, threads, fn, ctx))
    for (int i = 0; i < chunks; i++) fn(ctx, i);
}

}  // namespace mlxlmb
