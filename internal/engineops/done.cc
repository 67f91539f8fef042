// TensorFlow 2.18's C API hands an async kernel its done callback as a
// pointer to the std::function<void()> on ComputeAsync's stack frame
// (CAsyncOpKernel::ComputeAsync passes &done), which dies when the kernel's
// compute function returns. A kernel that completes later must first move
// the callback to the heap. TensorFlow's Linux builds use libstdc++, whose
// std::function layout this file shares.

#include <functional>
#include <utility>

extern "C" void* tfdist_keep_done(void* done) {
  return new std::function<void()>(
      std::move(*static_cast<std::function<void()>*>(done)));
}

extern "C" void tfdist_run_done(void* kept) {
  auto* done = static_cast<std::function<void()>*>(kept);
  (*done)();
  delete done;
}
