/* cuda_runtime.h stand-in for a build without the CUDA toolkit, beside cuRAND's PyPI wheel (CMakeLists.txt): curand.h
 * includes cuda_runtime.h only for these names in its declarations, and kparity calls cuRAND's host API alone. */
#ifndef KP_NO_TOOLKIT_CUDA_RUNTIME_H
#define KP_NO_TOOLKIT_CUDA_RUNTIME_H
#include <stddef.h> /* size_t */

typedef struct CUstream_st *cudaStream_t; /* as driver_types.h declares it: an opaque handle */
typedef enum libraryPropertyType_t { MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL } libraryPropertyType; /* as library_types.h */

#endif
