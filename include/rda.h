/* rda.h — the public C API of librda: ring dilated attention kernels generated at run time.
 * Status codes and version only for now; contexts, plans and launches arrive with the library issue.
 * Every value below is pinned: it never changes between releases. */
#ifndef RDA_H
#define RDA_H

#ifdef __cplusplus
extern "C" {
#endif

#define RDA_VERSION_MAJOR 0
#define RDA_VERSION_MINOR 1
#define RDA_VERSION_PATCH 0
#define RDA_VERSION_NUMBER (RDA_VERSION_MAJOR * 10000 + RDA_VERSION_MINOR * 100 + RDA_VERSION_PATCH)
#define RDA_VERSION_STRING "0.1.0"

#if defined(_WIN32)
#define RDA_API
#else
#define RDA_API __attribute__((visibility("default")))
#endif

typedef enum {
  RDA_OK = 0,
  RDA_ERR_INVALID_ARGUMENT = 1, /* a NULL, a bad shape, a bad stride, a bad flag */
  RDA_ERR_CONFIG = 2,           /* the attention config failed validation */
  RDA_ERR_NVRTC = 3,            /* run-time compilation failed */
  RDA_ERR_CUDA = 4,             /* a CUDA driver call failed, or no driver */
  RDA_ERR_NCCL = 5,             /* a collective failed */
  RDA_ERR_CACHE = 6,            /* the kernel cache could not be read or written */
  RDA_ERR_IO = 7,               /* a file could not be read or written */
  RDA_ERR_OUT_OF_MEMORY = 8,    /* host or device allocation failed */
  RDA_ERR_UNSUPPORTED = 9,      /* valid, but not supported by this build or device */
  RDA_ERR_INTERNAL = 10,        /* a bug in rda: please report it */
  RDA_ERR_EMULATOR = 11         /* the CPU emulator could not build or run a kernel */
} rda_status;

/* A static, never-NULL name for a status. */
RDA_API const char *rda_status_string(rda_status s);

/* RDA_VERSION_NUMBER of the library actually linked. */
RDA_API unsigned rda_version(void);

#ifdef __cplusplus
}
#endif
#endif /* RDA_H */
