/* nvrtc.c — run-time compilation of generated kernels with NVRTC: one program per variant, a
 * cubin (or its PTX) for one sm_XX, and the ptxas -v report parsed into registers, spill bytes
 * and static shared memory. Needs no GPU and no driver; thread-safe (nothing shared). */
#include "nvrtc.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sources.h"

#define RDA_NVRTC_MAX_ARCHS 64
/* Every option but the target; rda_nvrtc_options() spells them for the kernel cache key. */
#define RDA_NVRTC_FIXED_OPTIONS "-std=c++17", "-default-device", "--ptxas-options=-v", "-DRDA_NVRTC=1"
#define RDA_NVRTC_OPTIONS_TEXT "-std=c++17 -default-device --ptxas-options=-v -DRDA_NVRTC=1"

const char *rda_nvrtc_options(void) {
  return RDA_NVRTC_OPTIONS_TEXT;
}

const char *rda_nvrtc_target(int arch, char out[16]) {
  snprintf(out, 16, "sm_%d%s", arch, arch == 90 ? "a" : "");
  return out;
}

/* The toolkit's own declarations, by full path: a plain <nvrtc.h> would resolve to this
 * folder's nvrtc.h, which comes first on the include path. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef" /* the toolkit header tests undefined macros */
#include RDA_CUDA_NVRTC_H
#pragma GCC diagnostic pop

/* What ptxas reported for the entry (and the non-entry functions it may call). */
typedef struct rda_nvrtc_report {
  int found; /* a "Used N registers" line for the entry */
  int registers;
  int smem_bytes;
  int spill_bytes;
} rda_nvrtc_report;

static double rda_nvrtc_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int rda_nvrtc_version(void) {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return 0;
  return major * 1000 + minor * 10;
}

rda_status rda_nvrtc_driver_check(int driver_version, int nvrtc_version, rda_err *err) {
  if (driver_version <= 0 || nvrtc_version <= 0)
    return rda_err_set(err, RDA_ERR_CUDA, "cuda: unknown driver (%d) or NVRTC (%d) version",
                       driver_version, nvrtc_version);
  if (driver_version / 1000 >= nvrtc_version / 1000) return RDA_OK;
  return rda_err_set(err, RDA_ERR_CUDA,
                     "cuda: the driver supports CUDA %d.%d, older than NVRTC %d.%d that compiles "
                     "rda's kernels: install a driver for CUDA %d.0 or newer, or build rda "
                     "against a CUDA %d toolkit",
                     driver_version / 1000, driver_version % 1000 / 10, nvrtc_version / 1000,
                     nvrtc_version % 1000 / 10, nvrtc_version / 1000, driver_version / 1000);
}

/* Fills archs (as 80, 90, ...) with what this NVRTC can compile for; returns the count or -1. */
static int rda_nvrtc_archs(int archs[RDA_NVRTC_MAX_ARCHS]) {
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0 || n > RDA_NVRTC_MAX_ARCHS)
    return -1;
  if (nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS) return -1;
  return n;
}

int rda_nvrtc_arch_supported(int arch) {
  int archs[RDA_NVRTC_MAX_ARCHS];
  const int n = rda_nvrtc_archs(archs);
  for (int i = 0; i < n; ++i)
    if (archs[i] == arch) return 1;
  return 0;
}

static rda_status rda_nvrtc_check_arch(int arch, rda_err *err) {
  int archs[RDA_NVRTC_MAX_ARCHS];
  const int n = rda_nvrtc_archs(archs);
  if (n < 0)
    return rda_err_set(err, RDA_ERR_NVRTC, "nvrtc: cannot list the supported architectures");
  char list[256] = "";
  size_t len = 0;
  for (int i = 0; i < n; ++i) {
    if (archs[i] == arch) return RDA_OK;
    int w = snprintf(list + len, sizeof list - len, "%ssm_%d", i ? ", " : "", archs[i]);
    if (w > 0 && (size_t)w < sizeof list - len) len += (size_t)w;
  }
  const int v = rda_nvrtc_version();
  return rda_err_set(err, RDA_ERR_UNSUPPORTED,
                     "nvrtc %d.%d cannot compile for sm_%d (supported: %s)", v / 1000,
                     (v % 1000) / 10, arch, list);
}

/* The integer right before `what` in line (e.g. "1024 bytes smem"), or -1 when absent. */
static int rda_nvrtc_count_before(const char *line, size_t len, const char *what) {
  const size_t wl = strlen(what);
  for (size_t i = 0; i + wl <= len; ++i) {
    if (memcmp(line + i, what, wl) != 0) continue;
    size_t j = i;
    while (j > 0 && line[j - 1] == ' ') --j;
    size_t end = j;
    while (j > 0 && isdigit((unsigned char)line[j - 1])) --j;
    if (j == end) continue;
    long v = 0;
    for (size_t k = j; k < end && v < 1000000000L; ++k) v = v * 10 + (line[k] - '0');
    return (int)v;
  }
  return -1;
}

/* The integer right after `what` in line (e.g. "Used 10 registers"), or -1 when absent. */
static int rda_nvrtc_count_after(const char *line, size_t len, const char *what) {
  const size_t wl = strlen(what);
  for (size_t i = 0; i + wl <= len; ++i) {
    if (memcmp(line + i, what, wl) != 0) continue;
    size_t j = i + wl;
    while (j < len && line[j] == ' ') ++j;
    if (j >= len || !isdigit((unsigned char)line[j])) continue;
    long v = 0;
    while (j < len && isdigit((unsigned char)line[j]) && v < 1000000000L)
      v = v * 10 + (line[j++] - '0');
    return (int)v;
  }
  return -1;
}

/* Copies the quoted (or bare, up to a blank) name after `what` into out; 0 when absent. */
static int rda_nvrtc_name_after(const char *line, size_t len, const char *what, char *out,
                                size_t cap) {
  const char *p = NULL;
  const size_t wl = strlen(what);
  for (size_t i = 0; i + wl <= len; ++i)
    if (memcmp(line + i, what, wl) == 0) {
      p = line + i + wl;
      break;
    }
  if (p == NULL) return 0;
  const char *end = line + len;
  while (p < end && *p == ' ') ++p;
  const char quote = (p < end && (*p == '\'' || *p == '"')) ? *p++ : '\0';
  size_t n = 0;
  while (p < end && n + 1 < cap && *p != quote && !(quote == '\0' && isspace((unsigned char)*p)))
    out[n++] = *p++;
  out[n] = '\0';
  return n > 0;
}

/* Parses ptxas -v output (CUDA 11-13 layouts, each item wherever its line break falls):
 *   ptxas info    : Compiling entry function 'E' for 'sm_90'
 *   ptxas info    : Function properties for E
 *   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
 *   ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem, 360 bytes cmem[0]
 * Registers and smem are the entry's; spill bytes are the entry's plus those of every
 * non-entry function in the program (callees that were not inlined). */
static void rda_nvrtc_parse(const char *log, const char *entry, rda_nvrtc_report *rep) {
  enum { MAX_ENTRIES = 64 };
  char entries[MAX_ENTRIES][128];
  int nentries = 0;
  memset(rep, 0, sizeof *rep);

  /* Pass 1: the names of all entry functions. */
  for (const char *line = log; *line;) {
    const char *nl = strchr(line, '\n');
    const size_t len = nl ? (size_t)(nl - line) : strlen(line);
    if (nentries < MAX_ENTRIES &&
        rda_nvrtc_name_after(line, len, "Compiling entry function", entries[nentries], 128))
      ++nentries;
    line += len + (nl != NULL);
  }

  /* Pass 2: attribute each number to the function it describes. */
  char compiling[128] = "", props[128] = "";
  for (const char *line = log; *line;) {
    const char *nl = strchr(line, '\n');
    const size_t len = nl ? (size_t)(nl - line) : strlen(line);
    char name[128];
    if (rda_nvrtc_name_after(line, len, "Compiling entry function", name, sizeof name)) {
      memcpy(compiling, name, sizeof name);
      props[0] = '\0';
    }
    if (rda_nvrtc_name_after(line, len, "Function properties for", name, sizeof name))
      memcpy(props, name, sizeof name);

    const int in_entry = strcmp(compiling, entry) == 0;
    const int stores = rda_nvrtc_count_before(line, len, "bytes spill stores");
    const int loads = rda_nvrtc_count_before(line, len, "bytes spill loads");
    if (stores >= 0 || loads >= 0) {
      int props_is_entry = 0;
      for (int i = 0; i < nentries; ++i) props_is_entry |= strcmp(props, entries[i]) == 0;
      if (strcmp(props, entry) == 0 || (props[0] && !props_is_entry) || (!props[0] && in_entry))
        rep->spill_bytes += (stores > 0 ? stores : 0) + (loads > 0 ? loads : 0);
    }
    if (in_entry) {
      const int regs = rda_nvrtc_count_after(line, len, "Used");
      if (regs >= 0 && rda_nvrtc_count_before(line, len, "registers") == regs) {
        rep->found = 1;
        rep->registers = regs;
      }
      const int smem = rda_nvrtc_count_before(line, len, "bytes smem");
      if (smem >= 0) rep->smem_bytes = smem;
    }
    line += len + (nl != NULL);
  }
}

int rda_nvrtc_parse_report(const char *log, const char *entry, rda_nvrtc_out *out) {
  rda_nvrtc_report rep;
  rda_nvrtc_parse(log ? log : "", entry ? entry : "", &rep);
  if (!rep.found) return 0;
  out->registers = rep.registers;
  out->spill_bytes = rep.spill_bytes;
  out->smem_bytes = rep.smem_bytes;
  /* ptxas's C75xx advisories: wgmma serialized (C7510-C7518) or a warpgroup.arrive injected
   * (C7519) because an accumulator or A fragment was touched inside an async window. Either
   * halves the wgmma path's throughput without a word elsewhere. */
  out->wgmma_notices = 0;
  for (const char *p = log ? strstr(log, "(C75") : NULL; p != NULL; p = strstr(p + 4, "(C75"))
    ++out->wgmma_notices;
  return 1;
}

/* The first error lines of a log, joined by " | ", into out. */
static void rda_nvrtc_first_errors(const char *log, char *out, size_t cap) {
  size_t used = 0;
  int taken = 0;
  out[0] = '\0';
  for (const char *line = log; *line && taken < 3;) {
    const char *nl = strchr(line, '\n');
    const size_t len = nl ? (size_t)(nl - line) : strlen(line);
    int is_error = 0;
    for (size_t i = 0; i + 6 <= len && !is_error; ++i) is_error = memcmp(line + i, "error", 5) == 0;
    if (is_error) {
      int w = snprintf(out + used, cap - used, "%s%.*s", taken ? " | " : "", (int)len, line);
      if (w < 0) break;
      used += (size_t)w < cap - used ? (size_t)w : cap - used - 1;
      ++taken;
    }
    line += len + (nl != NULL);
  }
  if (taken == 0) snprintf(out, cap, "%.200s", log[0] ? log : "(empty log)");
}

/* The template headers, as NVRTC takes them. */
typedef struct rda_nvrtc_headers {
  int count;
  char *text[64];
  char *names[64];
} rda_nvrtc_headers;

static void rda_nvrtc_headers_free(rda_nvrtc_headers *h) {
  for (int i = 0; i < h->count; ++i) {
    free(h->text[i]);
    free(h->names[i]);
  }
  h->count = 0;
}

static rda_status rda_nvrtc_headers_load(rda_nvrtc_headers *h, rda_err *err) {
  static const char prefix[] = "templates/";
  h->count = 0;
  for (size_t i = 0; i < rda_sources_count(); ++i) {
    const char *name = rda_sources_name(i);
    const size_t n = strlen(name);
    if (strncmp(name, prefix, sizeof prefix - 1) != 0) continue;
    if (!(n > 2 && strcmp(name + n - 2, ".h") == 0) && !(n > 4 && strcmp(name + n - 4, ".cuh") == 0))
      continue;
    if (h->count == 64) {
      rda_nvrtc_headers_free(h);
      return rda_err_set(err, RDA_ERR_INTERNAL, "nvrtc: more than 64 template headers");
    }
    const rda_status st = rda_sources_read(name, &h->text[h->count], NULL, err);
    h->names[h->count] = strdup(name + sizeof prefix - 1);
    if (st != RDA_OK || h->names[h->count] == NULL) {
      free(h->text[h->count]);
      free(h->names[h->count]);
      rda_nvrtc_headers_free(h);
      return st != RDA_OK ? st : rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "nvrtc: out of memory");
    }
    ++h->count;
  }
  return RDA_OK;
}

#define RDA_NVRTC_CALL(call, what)                                                    \
  do {                                                                                \
    nvrtcResult rda_nvrtc_r_ = (call);                                                \
    if (rda_nvrtc_r_ != NVRTC_SUCCESS) {                                              \
      st = rda_err_set(err, RDA_ERR_NVRTC, "nvrtc.c:%d: %s: %s (%s)", __LINE__, what, \
                       nvrtcGetErrorString(rda_nvrtc_r_), name);                      \
      goto done;                                                                      \
    }                                                                                 \
  } while (0)

/* Options: -std=c++17 -default-device, the templates as named headers, -DRDA_NVRTC=1,
 * --ptxas-options=-v for the report; no --use_fast_math (the kernels use ex2 explicitly). The
 * target is always sm_XX, also for PTX (which is then the PTX the cubin was built from), so the
 * report is there either way. On failure *out is empty (compile_s aside) and err carries the
 * first error lines of the log. */
rda_status rda_nvrtc_compile(const char *source, const char *name, const char *entry, int arch,
                             int want_ptx, rda_nvrtc_out *out, rda_err *err) {
  if (out == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_nvrtc_compile: out is NULL");
  memset(out, 0, sizeof *out);
  if (source == NULL || name == NULL || entry == NULL || name[0] == '\0')
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "rda_nvrtc_compile: source, name and entry are required");
  RDA_TRY(rda_nvrtc_check_arch(arch, err));

  const double t0 = rda_nvrtc_now();
  rda_status st = RDA_OK;
  nvrtcProgram prog = NULL;
  int created = 0;
  rda_nvrtc_headers hd = {0};
  char file[160], opt_arch[48];
  snprintf(file, sizeof file, "%s.cu", name);
  /* Always a real sm_XX: ptxas runs (so the report exists) and the PTX is available too.
   * sm_90 compiles as sm_90a, whose arch-specific instructions (wgmma) the wgmma path needs;
   * sm_90a code runs on sm_90 devices only, which is all a cache entry for arch 90 serves. */
  char target[16];
  snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s", rda_nvrtc_target(arch, target));
  /* NVRTC 12.9+ keeps its own cache (with a driver present) and then skips ptxas, whose report
   * we need; rda caches cubins itself, so that cache is off. Not part of the cache key: the
   * output does not depend on it. */
  int nv_major = 0, nv_minor = 0;
  const int no_cache = nvrtcVersion(&nv_major, &nv_minor) == NVRTC_SUCCESS &&
                       (nv_major > 12 || (nv_major == 12 && nv_minor >= 9));
  const char *opts[] = {opt_arch, RDA_NVRTC_FIXED_OPTIONS, "--no-cache"};
  const int nopts = (int)(sizeof opts / sizeof opts[0]) - (no_cache ? 0 : 1);

  /* The templates go to NVRTC as in-memory headers (as librda embeds them, or from $RDA_HOME),
   * named as the sources #include them: "ptx.cuh", "emu/cuda_shim.h". */
  st = rda_nvrtc_headers_load(&hd, err);
  if (st != RDA_OK) return st;

  RDA_NVRTC_CALL(nvrtcCreateProgram(&prog, source, file, hd.count, (const char *const *)hd.text,
                                    (const char *const *)hd.names),
                 "nvrtcCreateProgram");
  created = 1;
  const nvrtcResult cr = nvrtcCompileProgram(prog, nopts, opts);

  size_t log_bytes = 0;
  RDA_NVRTC_CALL(nvrtcGetProgramLogSize(prog, &log_bytes), "nvrtcGetProgramLogSize");
  out->log = malloc(log_bytes + 1);
  if (out->log == NULL) {
    st = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "nvrtc: %s: no memory for the log", name);
    goto done;
  }
  out->log[0] = '\0';
  if (log_bytes > 0) RDA_NVRTC_CALL(nvrtcGetProgramLog(prog, out->log), "nvrtcGetProgramLog");
  out->log[log_bytes] = '\0';

  if (cr != NVRTC_SUCCESS) {
    char first[768];
    rda_nvrtc_first_errors(out->log, first, sizeof first);
    st = rda_err_set(err, RDA_ERR_NVRTC, "nvrtc: %s for sm_%d: %s: %s", file, arch,
                     nvrtcGetErrorString(cr), first);
    goto done;
  }

  size_t bytes = 0;
  if (want_ptx) {
    RDA_NVRTC_CALL(nvrtcGetPTXSize(prog, &bytes), "nvrtcGetPTXSize");
  } else {
    RDA_NVRTC_CALL(nvrtcGetCUBINSize(prog, &bytes), "nvrtcGetCUBINSize");
  }
  if (bytes == 0) {
    st = rda_err_set(err, RDA_ERR_NVRTC, "nvrtc: %s: empty %s", file, want_ptx ? "PTX" : "cubin");
    goto done;
  }
  out->image = malloc(bytes + 1);
  if (out->image == NULL) {
    st = rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "nvrtc: %s: no memory for a %zu-byte image", file,
                     bytes);
    goto done;
  }
  if (want_ptx) {
    RDA_NVRTC_CALL(nvrtcGetPTX(prog, (char *)out->image), "nvrtcGetPTX");
    out->image[bytes] = '\0';
    out->image_bytes = strlen((const char *)out->image);
  } else {
    RDA_NVRTC_CALL(nvrtcGetCUBIN(prog, (char *)out->image), "nvrtcGetCUBIN");
    out->image_bytes = bytes;
  }

  if (!rda_nvrtc_parse_report(out->log, entry, out)) {
    st = rda_err_set(err, RDA_ERR_NVRTC,
                     "nvrtc: %s: no ptxas report for entry '%s' (is it an extern \"C\" "
                     "__global__ function of the source?)",
                     file, entry);
    goto done;
  }

done:
  if (created) nvrtcDestroyProgram(&prog);
  rda_nvrtc_headers_free(&hd);
  out->compile_s = rda_nvrtc_now() - t0;
  if (st != RDA_OK) { /* the message carries the first errors; nothing to free on failure */
    const double t = out->compile_s;
    rda_nvrtc_out_free(out);
    out->compile_s = t;
  }
  return st;
}

void rda_nvrtc_out_free(rda_nvrtc_out *o) {
  if (o == NULL) return;
  free(o->image);
  free(o->log);
  memset(o, 0, sizeof *o);
}
