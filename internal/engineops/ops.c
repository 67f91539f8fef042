// The C half of tfdist's collective ops: op definitions, shape functions and
// the async kernel's entry points, which hand every call to Go.

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kernels.h"
#include "_cgo_export.h"
#include "queue.h"

// The second argument is the kernel's kind: kindAllReduce, kindAllGather,
// kindBroadcast, kindAggregate, kindLargest, kindReduceScatter and
// kindAllGatherBlocks in ops.go.
static void* tfdist_create_allreduce(TF_OpKernelConstruction* ctx) {
  return (void*)tfdistKernelCreate(ctx, 0);
}
static void* tfdist_create_allgather(TF_OpKernelConstruction* ctx) {
  return (void*)tfdistKernelCreate(ctx, 1);
}
static void* tfdist_create_broadcast(TF_OpKernelConstruction* ctx) {
  return (void*)tfdistKernelCreate(ctx, 2);
}
static void* tfdist_create_aggregate(TF_OpKernelConstruction* ctx) {
  return (void*)tfdistKernelCreate(ctx, 3);
}

static void* tfdist_create_largest(TF_OpKernelConstruction* ctx) {
  return (void*)tfdistKernelCreate(ctx, 4);
}
static void* tfdist_create_reducescatter(TF_OpKernelConstruction* ctx) {
  return (void*)tfdistKernelCreate(ctx, 5);
}
static void* tfdist_create_allgatherblocks(TF_OpKernelConstruction* ctx) {
  return (void*)tfdistKernelCreate(ctx, 6);
}

void* tfdist_keep_done(void* done);

// The kernels' calls wait in a queue for a goroutine that an eventfd wakes
// through Go's network poller. TensorFlow's threads never enter Go: a C
// thread that calls into Go leaves its P in the syscall state when it
// returns, and the goroutines it readied then wait for the runtime's
// monitor to take that P back (tens to hundreds of microseconds per call).
static pthread_mutex_t queue_mu = PTHREAD_MUTEX_INITIALIZER;
static tfdist_call* queue_head;
static tfdist_call* queue_tail;
static int queue_fd = -1;

int tfdist_queue_open(void) {
  queue_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  return queue_fd;
}

int tfdist_queue_take(tfdist_call* out) {
  pthread_mutex_lock(&queue_mu);
  tfdist_call* c = queue_head;
  if (c != NULL) {
    queue_head = c->next;
    if (queue_head == NULL) queue_tail = NULL;
  }
  pthread_mutex_unlock(&queue_mu);
  if (c == NULL) return 0;
  *out = *c;
  out->next = NULL;
  free(c);
  return 1;
}

static void tfdist_compute(void* k, TF_OpKernelContext* ctx,
                           TF_AsyncOpKernelDoneCallback* done) {
  tfdist_call* c = (tfdist_call*)malloc(sizeof(tfdist_call));
  c->kernel = (uintptr_t)k;
  c->ctx = ctx;
  c->done = tfdist_keep_done(done);
  c->next = NULL;
  pthread_mutex_lock(&queue_mu);
  if (queue_tail != NULL) {
    queue_tail->next = c;
  } else {
    queue_head = c;
  }
  queue_tail = c;
  pthread_mutex_unlock(&queue_mu);
  uint64_t one = 1;
  ssize_t n = write(queue_fd, &one, sizeof one);
  (void)n;  // the counter only overflows after 2^64-1 unread calls
}

static void tfdist_delete(void* k) { tfdistKernelDelete((uintptr_t)k); }

static void tfdist_release_shared(void* data, size_t len, void* flag) {
  (void)data;
  (void)len;
  __atomic_store_n((uint32_t*)flag, 1, __ATOMIC_RELEASE);
}

TF_Tensor* tfdist_shared_tensor(TF_DataType dtype, const int64_t* dims,
                                int num_dims, void* data, size_t len,
                                void* flag) {
  return TF_NewTensor(dtype, dims, num_dims, data, len, tfdist_release_shared,
                      flag);
}

static void tfdist_same_shape(TF_ShapeInferenceContext* ctx, TF_Status* st) {
  TF_ShapeHandle* h = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, h, st);
  if (TF_GetCode(st) == TF_OK) TF_ShapeInferenceContextSetOutput(ctx, 0, h, st);
  TF_DeleteShapeHandle(h);
}

static void tfdist_unknown_shape(TF_ShapeInferenceContext* ctx, TF_Status* st) {
  TF_ShapeInferenceContextSetUnknownShape(ctx, st);
}

static void tfdist_register(const char* name, const char* extra_attr,
                            const char* extra_attr2, int same_shape,
                            void* (*create)(TF_OpKernelConstruction*),
                            TF_Status* st) {
  TF_OpDefinitionBuilder* b = TF_NewOpDefinitionBuilder(name);
  TF_OpDefinitionBuilderAddInput(b, "input: T");
  TF_OpDefinitionBuilderAddOutput(b, "output: T");
  TF_OpDefinitionBuilderAddAttr(
      b, "T: {float, double, half, bfloat16, int32, int64}");
  TF_OpDefinitionBuilderAddAttr(b, "group: string");
  TF_OpDefinitionBuilderAddAttr(b, "tensor_name: string");
  if (extra_attr != NULL) TF_OpDefinitionBuilderAddAttr(b, extra_attr);
  if (extra_attr2 != NULL) TF_OpDefinitionBuilderAddAttr(b, extra_attr2);
  TF_OpDefinitionBuilderSetIsStateful(b, 1);
  TF_OpDefinitionBuilderSetShapeInferenceFunction(
      b, same_shape ? tfdist_same_shape : tfdist_unknown_shape);
  TF_RegisterOpDefinition(b, st);
  if (TF_GetCode(st) != TF_OK) return;
  TF_KernelBuilder* kb = TF_NewAsyncKernelBuilder(
      name, "CPU", create, tfdist_compute, tfdist_delete);
  TF_RegisterKernelBuilder(name, kb, st);
}

void tfdist_register_ops(TF_Status* st) {
  tfdist_register("TfdistAllReduce", "reduction: {'sum', 'min', 'max', 'sum_in_tree_order'}",
                  "wire: {'none', 'float16', 'bfloat16', 'int8'} = 'none'", 1,
                  tfdist_create_allreduce, st);
  if (TF_GetCode(st) != TF_OK) return;
  tfdist_register("TfdistAllGather", NULL, NULL, 0, tfdist_create_allgather, st);
  if (TF_GetCode(st) != TF_OK) return;
  tfdist_register("TfdistReduceScatter", "reduction: {'sum', 'min', 'max'}",
                  "wire: {'none', 'int8'} = 'none'", 0,
                  tfdist_create_reducescatter, st);
  if (TF_GetCode(st) != TF_OK) return;
  tfdist_register("TfdistAllGatherBlocks", "total: int >= 0", NULL, 0,
                  tfdist_create_allgatherblocks, st);
  if (TF_GetCode(st) != TF_OK) return;
  tfdist_register("TfdistBroadcast", "root: int", NULL, 1, tfdist_create_broadcast,
                  st);
  if (TF_GetCode(st) != TF_OK) return;
  tfdist_register("TfdistAggregate", "aggregator: string", NULL, 1,
                  tfdist_create_aggregate, st);
  if (TF_GetCode(st) != TF_OK) return;
  // Not a collective: a selection that runs on the same queue (largest.go).
  TF_OpDefinitionBuilder* b = TF_NewOpDefinitionBuilder("TfdistLargestIndices");
  TF_OpDefinitionBuilderAddInput(b, "input: float");
  TF_OpDefinitionBuilderAddOutput(b, "indices: int32");
  TF_OpDefinitionBuilderAddAttr(b, "k: int >= 1");
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, tfdist_unknown_shape);
  TF_RegisterOpDefinition(b, st);
  if (TF_GetCode(st) != TF_OK) return;
  TF_KernelBuilder* kb = TF_NewAsyncKernelBuilder(
      "TfdistLargestIndices", "CPU", tfdist_create_largest, tfdist_compute, tfdist_delete);
  TF_RegisterKernelBuilder("TfdistLargestIndices", kb, st);
}
