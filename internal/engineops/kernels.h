// The part of TensorFlow 2.18's kernel C API (tensorflow/c/kernels.h) that
// tfdist's collective ops use, declared here because the header itself
// includes TensorFlow-internal headers that installed libraries do not ship.
// The functions are exported by libtensorflow.

#ifndef TFDIST_ENGINEOPS_KERNELS_H_
#define TFDIST_ENGINEOPS_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#include "tensorflow/c/c_api.h"

// ops.h declares these as C++ does; C needs the typedefs first.
typedef struct TF_DimensionHandle TF_DimensionHandle;
typedef struct TF_OpDefinitionBuilder TF_OpDefinitionBuilder;
typedef struct TF_ShapeHandle TF_ShapeHandle;
typedef struct TF_ShapeInferenceContext TF_ShapeInferenceContext;
#include "tensorflow/c/ops.h"

typedef struct TF_KernelBuilder TF_KernelBuilder;
typedef struct TF_OpKernelConstruction TF_OpKernelConstruction;
typedef struct TF_OpKernelContext TF_OpKernelContext;
typedef struct TF_AsyncOpKernelDoneCallback TF_AsyncOpKernelDoneCallback;

extern TF_KernelBuilder* TF_NewAsyncKernelBuilder(
    const char* op_name, const char* device_name,
    void* (*create_func)(TF_OpKernelConstruction*),
    void (*compute_async_func)(void*, TF_OpKernelContext*,
                               TF_AsyncOpKernelDoneCallback* done),
    void (*delete_func)(void*));
extern void TF_RegisterKernelBuilder(const char* kernel_name,
                                     TF_KernelBuilder* builder,
                                     TF_Status* status);
extern void TF_GetInput(TF_OpKernelContext* ctx, int i, TF_Tensor** tensor,
                        TF_Status* status);
extern void TF_OpKernelConstruction_Failure(TF_OpKernelConstruction* ctx,
                                            TF_Status* status);
extern void TF_OpKernelContext_Failure(TF_OpKernelContext* ctx,
                                       TF_Status* status);
extern void TF_OpKernelConstruction_GetAttrSize(TF_OpKernelConstruction* ctx,
                                                const char* attr_name,
                                                int32_t* list_size,
                                                int32_t* total_size,
                                                TF_Status* status);
extern void TF_OpKernelConstruction_GetAttrString(
    TF_OpKernelConstruction* ctx, const char* attr_name, char* val,
    size_t max_length, TF_Status* status);
extern void TF_OpKernelConstruction_GetAttrInt64(TF_OpKernelConstruction* ctx,
                                                 const char* attr_name,
                                                 int64_t* val,
                                                 TF_Status* status);
extern TF_Tensor* TF_AllocateOutput(TF_OpKernelContext* context, int index,
                                    TF_DataType dtype, const int64_t* dims,
                                    int num_dims, size_t len,
                                    TF_Status* status);
extern void TF_SetOutput(TF_OpKernelContext* ctx, int i,
                         const TF_Tensor* tensor, TF_Status* status);
extern TF_Tensor* TF_ForwardInputOrAllocateOutput(
    TF_OpKernelContext* context, const int* candidate_input_indices,
    int num_candidate_input_indices, int output_index,
    const int64_t* output_dims, int output_num_dims, int* forwarded_input,
    TF_Status* status);

#endif  // TFDIST_ENGINEOPS_KERNELS_H_
