// The queue between the collective kernels' compute calls (on TensorFlow's
// threads) and the goroutine that starts them.

#ifndef TFDIST_ENGINEOPS_QUEUE_H_
#define TFDIST_ENGINEOPS_QUEUE_H_

#include <stdint.h>

#include "kernels.h"

typedef struct tfdist_call {
  uintptr_t kernel;          // the kernel's cgo.Handle
  TF_OpKernelContext* ctx;   // valid until done runs
  void* done;                // TensorFlow's done callback, on the heap
  struct tfdist_call* next;
} tfdist_call;

// tfdist_queue_open creates the eventfd that counts queued calls.
int tfdist_queue_open(void);
// tfdist_queue_take moves the oldest queued call into *out; 0 if none.
int tfdist_queue_take(tfdist_call* out);

// tfdist_shared_tensor wraps len bytes at data, memory that peers of the
// collective group map, as a tensor whose deallocator stores 1 in *flag
// (the buffer's release flag).
TF_Tensor* tfdist_shared_tensor(TF_DataType dtype, const int64_t* dims,
                                int num_dims, void* data, size_t len,
                                void* flag);

#endif  // TFDIST_ENGINEOPS_QUEUE_H_
