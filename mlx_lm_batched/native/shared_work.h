/* Work shared by threads that need not all arrive: a decode step's kernels without a
 * barrier that waits for a sleeping thread to wake up (shared_work.cpp). */
#pragma once

namespace mlxlmb {

/* fn(ctx, i) for every chunk i in [0, chunks), on the calling thread and up to
 * `threads` - 1 helper threads, each taking the next chunk as it comes free. Returns when
 * every chunk is done; a helper that wakes after the chunks have run out does nothing,
 * and nothing waits for it. Chunks must be independent (each writes its own outputs). */
void share_chunks(int chunks, int threads, void (*fn)(void*, int), void* ctx);

/* The same with a callable. */
template <typename F>
void share_chunks(int chunks, int threads, F& fn) {
  share_chunks(chunks, threads, [](void* f, int i) { (*static_cast<F*>(f))(i); }, &fn);
}

/* fn(b) for every block b in [0, blocks), shared out in chunks of consecutive blocks, a
 * few per thread (a helper that wakes late still finds some). */
template <typename F>
void share_blocks(int blocks, int threads, F& fn) {
  const int chunks = blocks < 8 * threads ? blocks : 8 * threads;
  auto chunk = [&](int c) {
    const int end = static_cast<int>(static_cast<long long>(c + 1) * blocks / chunks);
    for (int b = static_cast<int>(static_cast<long long>(c) * blocks / chunks); b < end; b++)
      fn(b);
  };
  share_chunks(chunks, threads, chunk);
}

/* Whether share_chunks uses its helpers (true) or OpenMP's parallel for (false): the
 * kernels' choice, for benchmarks that compare the two. */
bool shared_work_enabled();
void set_shared_work_enabled(bool enabled);

}  // namespace mlxlmb
