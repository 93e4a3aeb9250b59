/* gen.c — the C side of the generator: one Lua 5.4 state running the gen/ scripts, every call made
 * through lua_pcall with a traceback handler (lua.c's docall), config chunks (and user tuning
 * databases) run in a sandbox with bounded instructions, time and allocations, results copied
 * into C structs. */
#include "gen.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rda.h"
#include "sources.h"
#include "tuning_db.h"

#ifndef RDA_SOURCE_DIR
#define RDA_SOURCE_DIR "."
#endif

#define RDA_GEN_MAX_CONFIG_FILE (16 << 20) /* bytes of config source we are willing to read */

/* A sandboxed run the watchdog (rda_gen_enable_watchdog) watches: the thread running it (its
 * CPU clock) and the CPU time past which it has overrun its limit by the watchdog's margin. */
typedef struct rda_gen_watch {
  struct rda_gen_watch *next, *prev;
  clockid_t clock;
  double kill_at;  /* seconds of that clock */
  char line[1200]; /* the error line to write, "<program>: error: <name>: ...\n" */
  size_t len;
  int listed;
} rda_gen_watch;

struct rda_gen {
  lua_State *L;
  /* The allocator's ledger: bytes Lua holds now; while `armed` (a config chunk is running),
   * a request that would take `used` past `limit` fails and sets `tripped`. */
  size_t used, limit;
  int armed, tripped;
  long long byte_budget; /* the current sandbox run's budget, for its message */
  const char *chunkname; /* the running sandboxed chunk's name, for the limits' messages */
  const char *what;      /* what it is in them: "config" or "the tuning database" */
  long long instr_left;  /* the running sandboxed chunk's instructions left */
  double deadline;       /* ... and when it must be done (this thread's CPU clock, seconds) */
  double next_look;      /* CLOCK_MONOTONIC_COARSE seconds before which the deadline cannot be
                            reached (rda_gen_time_up) */
  double time_limit;     /* seconds a sandboxed run may take (rda_gen_set_time_limit) */
  double default_limit;  /* RDA_CONFIG_TIME_LIMIT, else RDA_GEN_SANDBOX_SECONDS */
  rda_gen_watch watch;   /* this generator's entry in the watchdog's list */
  double run_seconds;    /* the running chunk's limit, for its message */
  int bridge;            /* registry reference to gen/bridge.lua's module table */
  char trace[4096];      /* message and traceback of the last failed call */
};

const char *rda_gen_home(void) {
  const char *h = getenv("RDA_HOME");
  return h != NULL && h[0] != '\0' ? h : RDA_SOURCE_DIR;
}

const char *rda_gen_traceback(const rda_gen *g) {
  return g != NULL ? g->trace : "";
}

/* ---- allocation ------------------------------------------------------------------------ */

static void *rda_gen_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  rda_gen *g = ud;
  const size_t old = ptr != NULL ? osize : 0; /* with ptr == NULL, osize is a type tag */
  if (nsize == 0) {
    free(ptr);
    g->used -= old;
    return NULL;
  }
  if (g->armed && nsize > old && g->used - old + nsize > g->limit) {
    g->tripped = 1;
    return NULL;
  }
  void *p = realloc(ptr, nsize);
  if (p == NULL) {
    if (nsize > old) return NULL;
    p = ptr; /* a failed shrink keeps the larger block, which still serves */
  }
  g->used = g->used - old + nsize;
  return p;
}

static rda_gen *rda_gen_of(lua_State *L) {
  void *ud = NULL;
  (void)lua_getallocf(L, &ud);
  return ud;
}

/* ---- messages ---------------------------------------------------------------------------- */

/* Bytes of the well-formed UTF-8 character at s (RFC 3629: no overlong forms, surrogates or
 * code points past U+10FFFF), or 0. */
static size_t rda_gen_utf8_len(const unsigned char *s) {
  const unsigned char c = s[0];
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
  if (c >= 0xc2 && c <= 0xdf)
    n = 2;
  else if (c >= 0xe0 && c <= 0xef)
    n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4)
    n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else
    return 0;
  if (s[1] < lo || s[1] > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if ((s[k] & 0xc0) != 0x80) return 0;
  return n;
}

/* Copies msg into line[cap] as one line: line breaks and tabs become spaces, every other
 * control character (an ESC a config put in its message, say), C0, DEL or C1 (UTF-8 \xC2\x80 to
 * \xC2\x9F, e.g. the CSI \xC2\x9B), '?', so nothing reaches a terminal raw. A cut at cap never
 * splits a UTF-8 sequence; an incomplete one is '?'. With first_only, msg ends at its first
 * line break. Returns the length written. */
static size_t rda_gen_one_line(char *line, size_t cap, const char *msg, int first_only) {
  size_t o = 0;
  for (size_t i = 0; msg[i] != '\0' && !(first_only && msg[i] == '\n');) {
    const unsigned char ch = (unsigned char)msg[i];
    size_t n = 1; /* bytes of this character as copied */
    char rep = 0; /* its replacement, or 0 to copy it */
    if (ch == '\n' || ch == '\r' || ch == '\t') {
      rep = ' ';
    } else if (ch < 0x20 || ch == 0x7f) {
      rep = '?';
    } else if (ch >= 0x80) {
      /* A whole well-formed character, or '?' for this byte (a stray continuation byte, an
       * invalid or overlong lead); C1 controls (U+0080..U+009F) are '?' too. */
      n = rda_gen_utf8_len((const unsigned char *)msg + i);
      if (n == 0 || (ch == 0xc2 && (unsigned char)msg[i + 1] <= 0x9f)) rep = '?';
      if (n == 0) n = 1;
    }
    const size_t out = rep != 0 ? 1 : n;
    if (o + out + 1 > cap) break;
    if (rep != 0)
      line[o] = rep;
    else
      memcpy(line + o, msg + i, n);
    o += out;
    i += n;
  }
  if (cap > 0) line[o] = '\0';
  return o;
}

/* Records msg as one line (rda_gen_one_line). */
static rda_status rda_gen_fail_text(rda_err *err, rda_status s, const char *msg, int first_only) {
  /* Whole (one_line never lengthens), so rda_err_set shortens a long path, not the reason. */
  const size_t cap = strlen(msg) + 1;
  char *line = malloc(cap);
  if (line == NULL) {
    char cut[sizeof err->msg];
    rda_gen_one_line(cut, sizeof cut, msg, first_only);
    return rda_err_set(err, s, "%s", cut);
  }
  rda_gen_one_line(line, cap, msg, first_only);
  rda_err_set(err, s, "%s", line);
  free(line);
  return s;
}

static rda_status rda_gen_fail_line(rda_err *err, rda_status s, const char *msg) {
  return rda_gen_fail_text(err, s, msg, 0);
}

/* rda_gen_fail_line of a formatted message (one naming a path a user gave). */
static rda_status rda_gen_fail_fmt(rda_err *err, rda_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static rda_status rda_gen_fail_fmt(rda_err *err, rda_status s, const char *fmt, ...) {
  char line[4 * sizeof err->msg + 4096]; /* room for a whole path and the reason */
  va_list ap;
  va_start(ap, fmt);
  rda_text_vformat(line, sizeof line, fmt, ap);
  va_end(ap);
  return rda_gen_fail_line(err, s, line);
}

/* Message handler (lua.c's msghandler): the message plus a traceback. */
static int rda_gen_msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (msg == NULL) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

/* lua.c's docall: calls the function below the top nargs values with a traceback handler.
 * On failure the first line of the message goes to err with status `fail` (out of memory gets
 * RDA_ERR_OUT_OF_MEMORY), the whole traceback to g->trace, and nothing stays on the stack. */
static rda_status rda_gen_docall(rda_gen *g, int nargs, int nres, rda_status fail, rda_err *err) {
  lua_State *L = g->L;
  const int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, rda_gen_msghandler);
  lua_insert(L, base);
  const int st = lua_pcall(L, nargs, nres, base);
  lua_remove(L, base);
  if (st == LUA_OK) return RDA_OK;
  const char *msg = lua_tostring(L, -1);
  if (msg == NULL) msg = "(error object is not a string)";
  snprintf(g->trace, sizeof g->trace, "%s", msg);
  const rda_status s =
      rda_gen_fail_text(err, st == LUA_ERRMEM ? RDA_ERR_OUT_OF_MEMORY : fail, msg, 1);
  lua_pop(L, 1);
  return s;
}

/* Runs fn(ctx) protected: every Lua API call that can raise happens inside fn. */
static rda_status rda_gen_protected(rda_gen *g, lua_CFunction fn, void *ctx, rda_status fail,
                                    rda_err *err) {
  if (!lua_checkstack(g->L, 8))
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "generator: Lua stack exhausted");
  lua_pushcfunction(g->L, fn);
  lua_pushlightuserdata(g->L, ctx);
  return rda_gen_docall(g, 1, 0, fail, err);
}

/* Pushes bridge.<fn> (inside a protected function). */
static void rda_gen_push_bridge(lua_State *L, const char *fn) {
  rda_gen *g = rda_gen_of(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, g->bridge);
  if (lua_getfield(L, -1, fn) != LUA_TFUNCTION)
    luaL_error(L, "gen/bridge.lua has no function %s", fn);
  lua_remove(L, -2);
}

/* ---- the sandbox ------------------------------------------------------------------------- */

/* The name a sandboxed chunk is loaded under. Lua cuts a chunk name to about 60 characters in
 * its messages (LUA_IDSIZE), which would name a cut-off folder of a long path: a message that
 * starts with this short name gets the chunk's full name in its place (rda_gen_push_chunk_error),
 * and the limits' messages name it from the start. */
#define RDA_GEN_CHUNK "=(sandboxed chunk)"
#define RDA_GEN_CHUNK_SHOWN "(sandboxed chunk)"

/* Instructions between two count events of the sandbox's hook. The hook also runs at every
 * call, and looks at the clock each time: an instruction may be a long C call (string.upper of
 * 16 MiB) or compare two long strings (`<` of 24 MiB of "\0" calls strcoll per NUL: 0.2 s), so
 * counting instructions alone cannot bound the time; 10 of them between two looks overshoot
 * the limit by a few such compares at worst. */
#define RDA_GEN_HOOK_COUNT 10

/* How far past its limit (CPU seconds) a run stuck in one instruction may go before the
 * watchdog ends the process. */
#define RDA_GEN_WATCHDOG_MARGIN 1.0

static double rda_gen_clock(clockid_t id) {
  struct timespec ts;
  if (clock_gettime(id, &ts) != 0) return 0;
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This thread's CPU time: a stopped or throttled process spends none, so it cannot fail a
 * valid config, and a loaded machine does not make a test's short limit flaky. */
static double rda_gen_cpu_now(void) {
  return rda_gen_clock(CLOCK_THREAD_CPUTIME_ID);
}

/* 1 when the running sandboxed chunk is past its deadline. Reading the thread's CPU clock is a
 * system call (~0.3 us), too dear for every 10 instructions; the coarse monotonic clock is not.
 * A thread's CPU time grows no faster than wall time, so after a look that found `left`
 * seconds to go, the deadline cannot come before `left` seconds of wall time have passed: only
 * then is the CPU clock read again. */
static int rda_gen_time_up(rda_gen *g) {
  const double wall = rda_gen_clock(CLOCK_MONOTONIC_COARSE);
  if (wall < g->next_look) return 0;
  const double left = g->deadline - rda_gen_cpu_now();
  if (left <= 0) return 1;
  g->next_look = wall + left;
  return 0;
}

/* Starts the clock of a sandboxed run of `seconds`. */
static void rda_gen_start_clock(rda_gen *g, double seconds) {
  g->deadline = rda_gen_cpu_now() + seconds;
  g->next_look = 0;
}

/* Seconds from RDA_CONFIG_TIME_LIMIT (RDA_GEN_SANDBOX_SECONDS when unset or empty), or -1 with
 * err set when it is not a number from 0.01 to 3600. */
static double rda_gen_time_limit_env(rda_err *err) {
  const char *v = getenv("RDA_CONFIG_TIME_LIMIT");
  if (v == NULL || v[0] == '\0') return RDA_GEN_SANDBOX_SECONDS;
  char *end = NULL;
  errno = 0;
  const double x = strtod(v, &end);
  /* decimal only: no space, sign, "nan" or hex (strtod reads 0x10) */
  const int digit = ((v[0] >= '0' && v[0] <= '9') || v[0] == '.') &&
                    v[strspn(v, "0123456789.eE+-")] == '\0';
  if (!digit || errno != 0 || end == v || *end != '\0' || !(x >= 0.01 && x <= 3600)) {
    char shown[64];
    rda_gen_one_line(shown, sizeof shown, v, 0);
    rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                "RDA_CONFIG_TIME_LIMIT='%s': expected seconds, a number from 0.01 to 3600", shown);
    return -1;
  }
  return x;
}

void rda_gen_set_time_limit(rda_gen *g, double seconds) {
  if (g != NULL) g->time_limit = seconds > 0 && seconds <= 1e6 ? seconds : g->default_limit;
}

/* "<where>: <what> exceeds the time limit (N s)" into out[cap]: one text for the hooks' error
 * and the watchdog's line. Returns snprintf's count. */
static int rda_gen_time_message(char *out, size_t cap, const char *where, const char *what,
                                double seconds) {
  return snprintf(out, cap, "%s: %s exceeds the time limit (%g s)", where, what, seconds);
}

/* ---- the watchdog (rda_gen_enable_watchdog) ------------------------------------------------ */

static pthread_mutex_t rda_gen_wd_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t rda_gen_wd_cond = PTHREAD_COND_INITIALIZER;
static char rda_gen_wd_program[64]; /* "" while the watchdog is off */
static int rda_gen_wd_started;
static rda_gen_watch *rda_gen_wd_list;
/* Files the process removes when the watchdog ends it (rda_gen_watchdog_remove_on_kill). */
enum { RDA_GEN_WD_FILES = 4 };
static char rda_gen_wd_files[RDA_GEN_WD_FILES][4200];

void rda_gen_enable_watchdog(const char *program) {
  pthread_mutex_lock(&rda_gen_wd_mutex);
  snprintf(rda_gen_wd_program, sizeof rda_gen_wd_program, "%s",
           program != NULL && program[0] != '\0' ? program : "rda");
  pthread_mutex_unlock(&rda_gen_wd_mutex);
}

int rda_gen_watchdog_remove_on_kill(const char *path, int remove) {
  if (path == NULL || path[0] == '\0' || strlen(path) >= sizeof rda_gen_wd_files[0]) return 0;
  int done = 0;
  pthread_mutex_lock(&rda_gen_wd_mutex);
  for (int i = 0; i < RDA_GEN_WD_FILES && !done; ++i) {
    char *slot = rda_gen_wd_files[i];
    if (remove && slot[0] == '\0') {
      memcpy(slot, path, strlen(path) + 1);
      done = 1;
    } else if (!remove && strcmp(slot, path) == 0) {
      slot[0] = '\0';
      done = 1;
    }
  }
  pthread_mutex_unlock(&rda_gen_wd_mutex);
  return done;
}

int rda_gen_watchdog_watching(void) {
  int n = 0;
  pthread_mutex_lock(&rda_gen_wd_mutex);
  for (const rda_gen_watch *w = rda_gen_wd_list; w != NULL; w = w->next) n++;
  pthread_mutex_unlock(&rda_gen_wd_mutex);
  return n;
}

/* The watchdog's thread: sleeps while nothing is watched, else looks every 100 ms at each
 * watched run's CPU clock; one past its kill time has been inside one instruction (a hash
 * rehash of colliding keys, say) for RDA_GEN_WATCHDOG_MARGIN seconds past its limit, where no
 * hook can stop it: its error line goes out and the process ends. */
static void *rda_gen_wd_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&rda_gen_wd_mutex);
  for (;;) {
    while (rda_gen_wd_list == NULL) pthread_cond_wait(&rda_gen_wd_cond, &rda_gen_wd_mutex);
    for (const rda_gen_watch *w = rda_gen_wd_list; w != NULL; w = w->next) {
      if (rda_gen_clock(w->clock) >= w->kill_at) { /* 0 when the clock cannot be read */
        ssize_t r = write(STDERR_FILENO, w->line, w->len);
        (void)r;
        for (int i = 0; i < RDA_GEN_WD_FILES; ++i)
          if (rda_gen_wd_files[i][0] != '\0') (void)unlink(rda_gen_wd_files[i]);
        _exit(1);
      }
    }
    pthread_mutex_unlock(&rda_gen_wd_mutex);
    const struct timespec nap = {0, 100 * 1000 * 1000};
    nanosleep(&nap, NULL);
    pthread_mutex_lock(&rda_gen_wd_mutex);
  }
  return NULL;
}

/* Puts g's current sandboxed run (this thread, name, the deadline set) under the watchdog when
 * it is on, starting its thread on the first run. Every call is paired with rda_gen_unwatch
 * before the sandbox returns, with nothing that can raise in between. */
static void rda_gen_watch_run(rda_gen *g, const char *name, const char *what, double seconds) {
  pthread_mutex_lock(&rda_gen_wd_mutex);
  rda_gen_watch *w = &g->watch;
  if (rda_gen_wd_program[0] == '\0' || pthread_getcpuclockid(pthread_self(), &w->clock) != 0) {
    pthread_mutex_unlock(&rda_gen_wd_mutex);
    return;
  }
  if (!rda_gen_wd_started) {
    pthread_t t;
    pthread_attr_t attr;
    int ok = pthread_attr_init(&attr) == 0;
    if (ok) {
      pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
      ok = pthread_create(&t, &attr, rda_gen_wd_main, NULL) == 0;
      pthread_attr_destroy(&attr);
    }
    if (!ok) { /* no watchdog: the hooks alone, as in a library host */
      pthread_mutex_unlock(&rda_gen_wd_mutex);
      return;
    }
    rda_gen_wd_started = 1;
  }
  char shown[1024];
  rda_gen_one_line(shown, sizeof shown, name, 0);
  /* "<program>: error: <message>\n", cut to the buffer and still one line. */
  int n = snprintf(w->line, sizeof w->line, "%s: error: ", rda_gen_wd_program);
  if (n < 0) n = 0;
  if ((size_t)n < sizeof w->line - 1) {
    const int m = rda_gen_time_message(w->line + n, sizeof w->line - 1 - (size_t)n, shown, what,
                                       seconds);
    n += m < 0 ? 0 : m;
  }
  w->len = (size_t)n < sizeof w->line - 1 ? (size_t)n : sizeof w->line - 2;
  w->line[w->len++] = '\n';
  w->kill_at = g->deadline + RDA_GEN_WATCHDOG_MARGIN;
  w->prev = NULL;
  w->next = rda_gen_wd_list;
  if (w->next != NULL) w->next->prev = w;
  rda_gen_wd_list = w;
  w->listed = 1;
  pthread_cond_signal(&rda_gen_wd_cond);
  pthread_mutex_unlock(&rda_gen_wd_mutex);
}

static void rda_gen_unwatch(rda_gen *g) {
  rda_gen_watch *w = &g->watch;
  pthread_mutex_lock(&rda_gen_wd_mutex);
  if (w->listed) {
    if (w->prev != NULL)
      w->prev->next = w->next;
    else
      rda_gen_wd_list = w->next;
    if (w->next != NULL) w->next->prev = w->prev;
    w->listed = 0;
  }
  pthread_mutex_unlock(&rda_gen_wd_mutex);
}

/* Pushes "name:line" of the innermost frame of the sandboxed chunk itself on `co` (skipping
 * the sandbox's own helpers and C functions), or the name alone. */
static void rda_gen_push_where(lua_State *L, lua_State *co, const char *name) {
  lua_Debug ar;
  for (int level = 0; lua_getstack(co, level, &ar); level++) {
    if (lua_getinfo(co, "Sl", &ar) && ar.currentline > 0 && strcmp(ar.source, RDA_GEN_CHUNK) == 0) {
      lua_pushfstring(L, "%s:%d", name, ar.currentline);
      return;
    }
  }
  lua_pushstring(L, name);
}

/* Pushes "<where>: <what> exceeds the time limit (N s)" (rda_gen_time_message). */
static void rda_gen_push_time_error(lua_State *L, const char *where, const char *what,
                                    double seconds) {
  char line[4400]; /* where: a path (PATH_MAX) and a line number */
  rda_gen_time_message(line, sizeof line, where, what, seconds);
  lua_pushstring(L, line);
}

/* Raises the sandboxed chunk's limit error: its instruction limit (over_instr) or time limit. */
static int rda_gen_sandbox_exceeded(lua_State *L, rda_gen *g, int over_instr) {
  rda_gen_push_where(L, L, g->chunkname != NULL ? g->chunkname : "config");
  if (over_instr) {
    lua_pushfstring(L, ": %s exceeds the instruction limit", g->what);
    lua_concat(L, 2);
  } else {
    rda_gen_push_time_error(L, lua_tostring(L, -1), g->what, g->run_seconds);
    lua_remove(L, -2);
  }
  return lua_error(L);
}

/* Count events take RDA_GEN_HOOK_COUNT instructions off the budget; every event (count or
 * call) checks the deadline. */
static void rda_gen_sandbox_hook(lua_State *L, lua_Debug *ar) {
  rda_gen *g = rda_gen_of(L);
  int over_instr = 0;
  if (ar->event == LUA_HOOKCOUNT) {
    g->instr_left -= RDA_GEN_HOOK_COUNT;
    over_instr = g->instr_left <= 0;
  }
  if (over_instr || rda_gen_time_up(g)) rda_gen_sandbox_exceeded(L, g, over_instr);
}

/* t[i] < t[j] for native.sandbox_sort (table at 1, comparator or nil at 2). Without a
 * comparator the compare runs in C, unseen by the hook, and may take 0.2 s (two long strings
 * of NULs): the deadline is checked here, after every compare (rda_gen_time_up is cheap). */
static int rda_gen_sort_less(lua_State *L, rda_gen *g, lua_Integer i, lua_Integer j) {
  lua_geti(L, 1, i);
  lua_geti(L, 1, j);
  if (!lua_isnil(L, 2)) { /* a function: the call hook sees every call */
    lua_pushvalue(L, 2);
    lua_rotate(L, -3, 1);
    lua_call(L, 2, 1);
    const int r = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return r;
  }
  const int r = lua_compare(L, -2, -1, LUA_OPLT);
  lua_pop(L, 2);
  if (g->chunkname != NULL && rda_gen_time_up(g)) rda_gen_sandbox_exceeded(L, g, 0);
  return r;
}

/* native.sandbox_sort(t [, comp]): the sandbox's table.sort, a heapsort in place (unstable, as
 * table.sort; never out of bounds, whatever comp answers) under the sandbox's time limit: the
 * library's sort compares without a comparator in one C call the hook cannot interrupt, hours
 * for a table of long equal strings. */
static int rda_gen_l_sandbox_sort(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  if (!lua_isnoneornil(L, 2)) luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  const lua_Integer n = luaL_len(L, 1);
  luaL_argcheck(L, n < INT_MAX, 1, "array too big");
  rda_gen *g = rda_gen_of(L);
  /* Max-heap over t[1..end], built bottom-up, then the largest moved to the end, repeatedly. */
  for (lua_Integer start = n / 2, end = n; end > 1;) {
    lua_Integer root;
    if (start > 0) {
      root = start--;
    } else {
      lua_geti(L, 1, 1); /* swap t[1] and t[end] */
      lua_geti(L, 1, end);
      lua_seti(L, 1, 1);
      lua_seti(L, 1, end);
      root = 1;
      if (--end <= 1) break;
    }
    for (lua_Integer child; (child = 2 * root) <= end; root = child) {
      if (child + 1 <= end && rda_gen_sort_less(L, g, child, child + 1)) child++;
      if (!rda_gen_sort_less(L, g, root, child)) break;
      lua_geti(L, 1, root);
      lua_geti(L, 1, child);
      lua_seti(L, 1, root);
      lua_seti(L, 1, child);
    }
  }
  return 0;
}

/* Pushes msg, an error message of the sandboxed chunk `name`, as reported: Lua's short name
 * for the chunk replaced by the full name, the name put in front of a message that lacks it
 * (error("x", 0), "C stack overflow"), "(empty message)" for one that says nothing. */
static void rda_gen_push_chunk_error(lua_State *L, const char *msg, const char *name) {
  const size_t sn = strlen(RDA_GEN_CHUNK_SHOWN), nn = strlen(name);
  const char *named = NULL; /* msg from the ':' after the chunk's name, when it starts so */
  if (strncmp(msg, RDA_GEN_CHUNK_SHOWN, sn) == 0 && msg[sn] == ':')
    named = msg + sn;
  else if (strncmp(msg, name, nn) == 0 && msg[nn] == ':')
    named = msg + nn;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, name);
  const char *body = msg;
  if (named == NULL) {
    luaL_addchar(&b, ':');
  } else {
    const char *p = named + 1, *digits = p;
    while (*p >= '0' && *p <= '9') p++;
    if (p > digits && *p == ':') { /* keep ":<line>:" */
      luaL_addlstring(&b, named, (size_t)(p + 1 - named));
      body = p + 1;
    } else {
      luaL_addchar(&b, ':');
      body = named + 1;
    }
  }
  while (*body == ' ') body++;
  luaL_addchar(&b, ' ');
  luaL_addstring(&b, *body != '\0' ? body : "(empty message)");
  luaL_pushresult(&b);
}

/* Runs check(value) (the function at index `check`; the value on top of L, replaced) in a
 * fresh coroutine under what is left of the sandboxed run's clock and its watchdog: checking
 * what a chunk returned is trusted code, but its work grows with that value (20,000 entries
 * that share one list of 200,000 tiles take hours to check). No instruction budget of its own,
 * no allocation limit (it copies what it checks at most). Leaves true, result | false,
 * message, as native.sandbox_run. */
static int rda_gen_sandbox_check(lua_State *L, rda_gen *g, int check, const char *name,
                                 const char *what, double max_seconds) {
  lua_State *cv = lua_newthread(L);
  lua_pushvalue(L, check);
  lua_pushvalue(L, -3);
  lua_xmove(L, cv, 2);
  lua_sethook(cv, rda_gen_sandbox_hook, LUA_MASKCOUNT | LUA_MASKCALL, RDA_GEN_HOOK_COUNT);
  g->instr_left = LLONG_MAX;
  g->chunkname = name;
  g->what = what;
  int nres = 0;
  rda_gen_watch_run(g, name, what, max_seconds);
  const int st = lua_resume(cv, L, 1, &nres);
  rda_gen_unwatch(g);
  g->chunkname = NULL;
  lua_sethook(cv, NULL, 0, 0);
  if (st == LUA_OK && rda_gen_cpu_now() >= g->deadline) {
    lua_pushboolean(L, 0);
    rda_gen_push_time_error(L, name, what, max_seconds);
  } else if (st == LUA_OK && nres > 0 && !lua_isnil(cv, -nres)) {
    lua_pushboolean(L, 1);
    lua_pushvalue(cv, -nres);
    lua_xmove(cv, L, 1);
  } else if (st == LUA_OK) { /* nil, message */
    lua_pushboolean(L, 0);
    if (nres > 1 && lua_type(cv, -nres + 1) == LUA_TSTRING) {
      lua_pushvalue(cv, -nres + 1);
      lua_xmove(cv, L, 1);
    } else
      lua_pushfstring(L, "%s: %s failed its checks", name, what);
  } else {
    lua_pushboolean(L, 0);
    if (lua_type(cv, -1) == LUA_TSTRING)
      lua_xmove(cv, L, 1);
    else
      lua_pushfstring(L, "%s: checking the %s raised a %s", name, what, luaL_typename(cv, -1));
  }
  lua_remove(L, -3); /* the thread, kept until its results were copied */
  lua_remove(L, -3); /* the value */
  return 2;
}

/* Where Lua source text starts: after a UTF-8 byte order mark and a first line that starts
 * with '#' (a "#!" line), as the stand-alone interpreter (luaL_loadfilex) skips them; the
 * newline of that line stays, so line numbers are the file's. */
static const char *rda_gen_source_start(const char *text, size_t *len) {
  if (*len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) text += 3, *len -= 3;
  if (*len > 0 && text[0] == '#') {
    const char *nl = memchr(text, '\n', *len);
    const size_t skip = nl != NULL ? (size_t)(nl - text) : *len;
    text += skip, *len -= skip;
  }
  return text;
}

/* native.sandbox_run(text, name, env, max_instructions, max_bytes[, max_seconds[, what
 *                    [, check]]]) -> true, value | false, message
 * Loads text (source only; a byte order mark and a "#!" line skipped) as the chunk `name` (a
 * leading '=' or '@' is dropped) with env as its _ENV and runs it in a fresh coroutine. A hook
 * counts its instructions and bounds its time (max_seconds; default the generator's limit,
 * rda_gen_set_time_limit, parse included); its allocations, parse included, are bounded by
 * max_bytes. The limits' messages call it `what` (default "config"; "the tuning database").
 * While it runs, string methods ("x"):rep() see env.string instead of the generator's string
 * library. With `check`, a function(value) -> result | nil, message, the value is what check
 * makes of it, checked within the same time limit (rda_gen_sandbox_check). A message names
 * `name` in full, on one line when it reaches C (rda_gen_fail_line). */
static int rda_gen_l_sandbox_run(lua_State *L) {
  size_t len;
  const char *text = luaL_checklstring(L, 1, &len);
  const char *name = luaL_checkstring(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  const lua_Integer max_instr = luaL_checkinteger(L, 4);
  const lua_Integer max_bytes = luaL_checkinteger(L, 5);
  rda_gen *g = rda_gen_of(L);
  const double max_seconds = (double)luaL_optnumber(L, 6, (lua_Number)g->time_limit);
  luaL_argcheck(L, max_instr > 0, 4, "instruction limit must be positive");
  luaL_argcheck(L, max_bytes > 0, 5, "byte limit must be positive");
  luaL_argcheck(L, max_seconds > 0 && max_seconds <= 1e6, 6, "time limit out of range");
  luaL_argcheck(L, lua_getfield(L, 3, "string") == LUA_TTABLE, 3, "env.string must be a table");
  lua_pop(L, 1);
  if (name[0] == '=' || name[0] == '@') name++;
  const char *what = luaL_optstring(L, 7, "config");
  if (!lua_isnoneornil(L, 8)) luaL_checktype(L, 8, LUA_TFUNCTION);
  lua_settop(L, 8);
  text = rda_gen_source_start(text, &len);

  if (len > 0 && text[0] == LUA_SIGNATURE[0]) {
    lua_pushboolean(L, 0);
    lua_pushfstring(L, "%s: binary chunks are not accepted: %s must be Lua source text", name,
                    strcmp(what, "config") == 0 ? "a config" : what);
    return 2;
  }
  lua_State *co = lua_newthread(L); /* 9 */
  /* One budget for the parse and the run: a chunk's constants and functions count too. */
  rda_gen_start_clock(g, max_seconds);
  g->run_seconds = max_seconds;
  g->limit = g->used + (size_t)max_bytes;
  g->byte_budget = (long long)max_bytes;
  g->tripped = 0;
  g->armed = 1;
  rda_gen_watch_run(g, name, what, max_seconds);
  const int loaded = luaL_loadbufferx(co, text, len, RDA_GEN_CHUNK, "t");
  rda_gen_unwatch(g);
  g->armed = 0;
  /* No hook runs during the parse, nor inside one long instruction: a look at the clock after
   * each, so an overrun is never accepted. */
  if (rda_gen_cpu_now() >= g->deadline) {
    lua_pushboolean(L, 0);
    rda_gen_push_time_error(L, name, what, max_seconds);
    return 2;
  }
  if (loaded != LUA_OK) {
    lua_pushboolean(L, 0);
    if (loaded == LUA_ERRMEM && g->tripped) {
      lua_pushfstring(L, "%s: %s exceeds the memory limit (%d MiB)", name, what,
                      (int)(g->byte_budget >> 20));
    } else if (lua_type(co, -1) == LUA_TSTRING &&
               strstr(lua_tostring(co, -1), "C stack overflow") != NULL) {
      /* Lua's parser says only that, with no line: say what in the text caused it. */
      lua_pushfstring(L, "%s: %s nests too deeply for Lua's parser (C stack overflow)", name,
                      strcmp(what, "config") == 0 ? "the config" : what);
    } else {
      lua_xmove(co, L, 1);
      rda_gen_push_chunk_error(L, lua_tostring(L, -1), name);
      lua_remove(L, -2);
    }
    return 2;
  }
  lua_pushvalue(L, 3);
  lua_xmove(L, co, 1);
  if (lua_setupvalue(co, -2, 1) == NULL) lua_pop(co, 1); /* upvalue 1 of a main chunk: _ENV */

  lua_pushliteral(L, "");
  if (!lua_getmetatable(L, -1)) return luaL_error(L, "strings have no metatable");
  lua_remove(L, -2);              /* 10: the string metatable */
  lua_getfield(L, 10, "__index"); /* 11: the generator's string library */
  lua_getfield(L, 3, "string");
  lua_setfield(L, 10, "__index");

  lua_sethook(co, rda_gen_sandbox_hook, LUA_MASKCOUNT | LUA_MASKCALL, RDA_GEN_HOOK_COUNT);
  g->instr_left = (long long)max_instr;
  g->tripped = 0;
  g->chunkname = name;
  g->what = what;
  g->armed = 1;
  int nres = 0;
  rda_gen_watch_run(g, name, what, max_seconds);
  const int st = lua_resume(co, L, 0, &nres);
  rda_gen_unwatch(g);
  g->armed = 0;
  g->chunkname = NULL;
  lua_sethook(co, NULL, 0, 0);
  lua_pushvalue(L, 11);
  lua_setfield(L, 10, "__index");

  if (st == LUA_OK && rda_gen_cpu_now() >= g->deadline) {
    lua_pushboolean(L, 0);
    rda_gen_push_time_error(L, name, what, max_seconds);
    return 2;
  }
  if (st == LUA_OK) {
    if (nres > 0) {
      lua_pop(co, nres - 1);
      lua_xmove(co, L, 1);
    } else {
      lua_pushnil(L);
    }
    if (!lua_isnil(L, 8)) return rda_gen_sandbox_check(L, g, 8, name, what, max_seconds);
    lua_pushboolean(L, 1);
    lua_insert(L, -2);
    return 2;
  }
  lua_pushboolean(L, 0);
  if (st == LUA_ERRMEM && g->tripped) {
    rda_gen_push_where(L, co, name);
    lua_pushfstring(L, ": %s exceeds the memory limit (%d MiB)", what, (int)(g->byte_budget >> 20));
    lua_concat(L, 2);
  } else if (st == LUA_YIELD) {
    lua_pushfstring(L, "%s: the config yielded instead of returning a table", name);
  } else if (lua_type(co, -1) == LUA_TSTRING) {
    lua_xmove(co, L, 1);
    rda_gen_push_chunk_error(L, lua_tostring(L, -1), name);
    lua_remove(L, -2);
  } else {
    lua_pushfstring(L, "%s: the config raised an error that is a %s, not a message", name,
                    luaL_typename(co, -1));
  }
  return 2;
}

/* native.home() -> $RDA_HOME, or "(embedded)" when librda serves its own copies */
static int rda_gen_l_home(lua_State *L) {
  const char *home = rda_sources_home();
  lua_pushstring(L, home != NULL ? home : "(embedded)");
  return 1;
}

/* native.source(name) -> text | nil, message: a file of gen/, tuning/ or templates/ as librda
 * serves it (runtime/sources.h). */
static int rda_gen_l_source(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  char *text = NULL;
  size_t len = 0;
  rda_err err = {0};
  if (rda_sources_read(name, &text, &len, &err) != RDA_OK) {
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    return 2;
  }
  lua_pushlstring(L, text, len); /* may raise (memory): free first */
  free(text);
  return 1;
}

static const luaL_Reg rda_gen_native[] = {
    {"sandbox_run", rda_gen_l_sandbox_run},
    {"sandbox_sort", rda_gen_l_sandbox_sort},
    {"home", rda_gen_l_home},
    {"source", rda_gen_l_source},
    {NULL, NULL},
};

static int rda_gen_open_native(lua_State *L) {
  luaL_newlib(L, rda_gen_native);
  lua_pushinteger(L, RDA_MAX_BRANCHES); /* one source of truth: runtime/config.h */
  lua_setfield(L, -2, "max_branches");
  return 1;
}

/* ---- open / close ------------------------------------------------------------------------ */

/* package.searchers entry: module "gen.plan" is the source "gen/plan.lua" that runtime/sources.h
 * serves (embedded, or under $RDA_HOME), so no source tree is needed. */
static int rda_gen_searcher(lua_State *L) {
  const char *mod = luaL_checkstring(L, 1);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (const char *c = mod; *c; ++c) luaL_addchar(&b, *c == '.' ? '/' : *c);
  luaL_addstring(&b, ".lua");
  luaL_pushresult(&b); /* 2: the relative name */
  const char *name = lua_tostring(L, 2);
  char *text = NULL;
  size_t len = 0;
  rda_err err = {0};
  if (rda_sources_read(name, &text, &len, &err) != RDA_OK) {
    lua_pushfstring(L, "\n\t%s", err.msg);
    return 1;
  }
  const char *home = rda_sources_home();
  char chunk[4200];
  snprintf(chunk, sizeof chunk, "@%s%s%s", home ? home : "", home ? "/" : "", name);
  const int st = luaL_loadbufferx(L, text, len, chunk, "t");
  free(text);
  if (st != LUA_OK) return lua_error(L);
  lua_pushstring(L, chunk + 1);
  return 2;
}

static int rda_gen_p_open(lua_State *L) {
  rda_gen *g = rda_gen_of(L);
  luaL_openlibs(L);
  /* No script of ours needs string.dump; removing it also hides it from string methods. */
  lua_getglobal(L, "string");
  lua_pushnil(L);
  lua_setfield(L, -2, "dump");
  lua_pop(L, 1);
  lua_getglobal(L, "package");
  lua_pushliteral(L, "");
  lua_setfield(L, -2, "path");
  lua_pushliteral(L, "");
  lua_setfield(L, -2, "cpath");
  lua_getfield(L, -1, "searchers"); /* keep the preload searcher, then ours alone */
  lua_pushcfunction(L, rda_gen_searcher);
  lua_rawseti(L, -2, 2);
  for (lua_Integer i = (lua_Integer)luaL_len(L, -1); i > 2; --i) {
    lua_pushnil(L);
    lua_rawseti(L, -2, i);
  }
  lua_pop(L, 1);
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, rda_gen_open_native);
  lua_setfield(L, -2, "rda.native");
  lua_pop(L, 2);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "gen.bridge");
  lua_call(L, 1, 1);
  if (!lua_istable(L, -1)) return luaL_error(L, "gen/bridge.lua did not return a table");
  g->bridge = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

rda_status rda_gen_open(rda_gen **out, rda_err *err) {
  if (out == NULL) return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_gen_open: out is NULL");
  *out = NULL;
  char *bridge = NULL; /* gen/ must be there: say so plainly rather than from inside Lua */
  RDA_TRY(rda_sources_read("gen/bridge.lua", &bridge, NULL, err));
  free(bridge);
  rda_gen *g = calloc(1, sizeof *g);
  if (g == NULL) return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "generator: out of memory");
  g->bridge = LUA_NOREF;
  g->default_limit = rda_gen_time_limit_env(err);
  if (g->default_limit < 0) {
    free(g);
    return RDA_ERR_INVALID_ARGUMENT;
  }
  g->time_limit = g->default_limit;
  g->L = lua_newstate(rda_gen_alloc, g);
  if (g->L == NULL) {
    free(g);
    return rda_err_set(err, RDA_ERR_OUT_OF_MEMORY, "generator: cannot create a Lua state");
  }
  const rda_status s = rda_gen_protected(g, rda_gen_p_open, NULL, RDA_ERR_INTERNAL, err);
  if (s != RDA_OK) {
    rda_gen_close(g);
    return s;
  }
  *out = g;
  return RDA_OK;
}

void rda_gen_close(rda_gen *g) {
  if (g == NULL) return;
  rda_gen_unwatch(g); /* never listed here; for certainty, as g's memory goes */
  if (g->L != NULL) lua_close(g->L);
  free(g);
}

/* ---- field access inside protected functions --------------------------------------------- */

static lua_Integer rda_gen_int_field(lua_State *L, int t, const char *key, lua_Integer lo,
                                     lua_Integer hi) {
  lua_getfield(L, t, key);
  int ok = 0;
  const lua_Integer v = lua_tointegerx(L, -1, &ok);
  lua_pop(L, 1);
  if (!ok || v < lo || v > hi)
    return luaL_error(L, "generator returned a bad %s (want an integer in [%I, %I])", key, lo, hi);
  return v;
}

static const char *rda_gen_str_field(lua_State *L, int t, const char *key) {
  lua_getfield(L, t, key);
  const char *s = lua_tostring(L, -1);
  if (s == NULL) luaL_error(L, "generator returned no string %s", key);
  lua_pop(L, 1); /* still referenced by the table, so s stays valid */
  return s;
}

static int rda_gen_bool_field(lua_State *L, int t, const char *key) {
  lua_getfield(L, t, key);
  const int v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* ---- config ------------------------------------------------------------------------------ */

typedef struct rda_gen_config_ctx {
  const char *text;
  size_t len;
  const char *name;
  rda_config *out;
  rda_err *err;
  rda_status status;
} rda_gen_config_ctx;

static void rda_gen_read_list(lua_State *L, int t, const char *key, int n, int64_t *out) {
  lua_getfield(L, t, key);
  if (!lua_istable(L, -1) || (int)luaL_len(L, -1) != n)
    luaL_error(L, "generator returned a bad %s list", key);
  for (int i = 0; i < n; i++) {
    lua_geti(L, -1, i + 1);
    int ok = 0;
    const lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok || !rda_config_size_ok(v))
      luaL_error(L, "generator returned a bad %s[%d]", key, i + 1);
    out[i] = (int64_t)v;
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

static int rda_gen_p_config(lua_State *L) {
  rda_gen_config_ctx *c = lua_touserdata(L, 1);
  rda_gen_push_bridge(L, "config");
  lua_pushlstring(L, c->text, c->len);
  lua_pushstring(L, c->name);
  lua_call(L, 2, 2);
  if (lua_isnil(L, -2)) {
    c->status = rda_gen_fail_line(c->err, RDA_ERR_CONFIG, luaL_optstring(L, -1, "invalid config"));
    return 0;
  }
  lua_pop(L, 1);
  const int t = lua_gettop(L);
  rda_config *o = c->out;
  memset(o, 0, sizeof *o);
  o->heads = (int)rda_gen_int_field(L, t, "heads", 1, INT_MAX);
  o->kv_heads = (int)rda_gen_int_field(L, t, "kv_heads", 1, o->heads);
  o->head_dim = (int)rda_gen_int_field(L, t, "head_dim", 1, 1024);
  o->dtype =
      strcmp(rda_gen_str_field(L, t, "dtype"), "fp16") == 0 ? RDA_DTYPE_FP16 : RDA_DTYPE_BF16;
  lua_getfield(L, t, "segments");
  const lua_Integer n = luaL_len(L, -1);
  lua_pop(L, 1);
  if (n < 1 || n > RDA_MAX_BRANCHES) return luaL_error(L, "generator returned %I branches", n);
  o->nbranch = (int)n;
  rda_gen_read_list(L, t, "segments", o->nbranch, o->segments);
  rda_gen_read_list(L, t, "dilations", o->nbranch, o->dilations);
  const char *off = rda_gen_str_field(L, t, "offsets");
  o->offsets = strcmp(off, "block") == 0   ? RDA_OFFSETS_BLOCK
               : strcmp(off, "group") == 0 ? RDA_OFFSETS_GROUP
                                           : RDA_OFFSETS_MOD;
  o->causal = rda_gen_bool_field(L, t, "causal");
  lua_getfield(L, t, "scale");
  o->scale = lua_tonumber(L, -1);
  if (o->scale == 0 || !rda_config_scale_fits(o->scale))
    return luaL_error(L, "generator returned a bad scale");
  c->status = RDA_OK;
  return 0;
}

static rda_status rda_gen_config_text(rda_gen *g, const char *text, size_t len, const char *name,
                                      rda_config *out, rda_err *err) {
  rda_gen_config_ctx c = {text, len, name, out, err, RDA_ERR_INTERNAL};
  rda_status s = rda_gen_protected(g, rda_gen_p_config, &c, RDA_ERR_INTERNAL, err);
  lua_gc(g->L, LUA_GCCOLLECT); /* drop what the config built */
  if (s == RDA_OK) s = c.status;
  if (s != RDA_OK) memset(out, 0, sizeof *out);
  return s;
}

rda_status rda_gen_config_string(rda_gen *g, const char *chunk, const char *chunkname,
                                 rda_config *out, rda_err *err) {
  if (g == NULL || chunk == NULL || out == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_gen_config_string: NULL argument");
  return rda_gen_config_text(g, chunk, strlen(chunk), chunkname != NULL ? chunkname : "config", out,
                             err);
}

rda_status rda_gen_config_file(rda_gen *g, const char *path, rda_config *out, rda_err *err) {
  if (g == NULL || path == NULL || out == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_gen_config_file: NULL argument");
  memset(out, 0, sizeof *out);
  /* O_NONBLOCK: the open of a FIFO (or device) must not wait for a writer. A FIFO or pipe
   * (`<(cat ok.lua)`, /dev/stdin of `cat ok.lua | rdagen ...`) is read with poll() under the
   * time limit, so one that nobody writes fails after it; folders, sockets and devices are
   * refused. */
  const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return rda_gen_fail_fmt(err, RDA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return rda_gen_fail_fmt(err, RDA_ERR_IO, "%s: cannot read: %s", path, strerror(e));
  }
  const int fifo = S_ISFIFO(st.st_mode);
  if (!S_ISREG(st.st_mode) && !fifo) {
    close(fd);
    return rda_gen_fail_fmt(err, RDA_ERR_IO, "%s: cannot read: not a regular file (%s)", path,
                            S_ISDIR(st.st_mode)    ? "a folder"
                            : S_ISSOCK(st.st_mode) ? "a socket"
                                                   : "a device");
  }
  const int fl = fcntl(fd, F_GETFL);
  if (!fifo && fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK); /* a regular file */
  char *buf = malloc(RDA_GEN_MAX_CONFIG_FILE + 1);
  if (buf == NULL) {
    close(fd);
    return rda_gen_fail_fmt(err, RDA_ERR_OUT_OF_MEMORY, "%s: out of memory reading it", path);
  }
  /* Read to the end (at most one byte past the limit), whatever st_size said. A FIFO: waiting
   * (wall time: a writer may be slow, not us) at most the time limit in all. */
  const double give_up = rda_gen_clock(CLOCK_MONOTONIC) + g->time_limit;
  size_t len = 0;
  int bad = 0, late = 0;
  while (len < RDA_GEN_MAX_CONFIG_FILE + 1) {
    if (fifo) {
      const double left = give_up - rda_gen_clock(CLOCK_MONOTONIC);
      struct pollfd pfd = {fd, POLLIN, 0};
      const int pr = left > 0 ? poll(&pfd, 1, (int)(left * 1000) + 1) : 0;
      if (pr < 0 && errno == EINTR) continue;
      if (pr < 0) {
        bad = errno;
        break;
      }
      if (pr == 0) {
        late = 1;
        break;
      }
    }
    const ssize_t r = read(fd, buf + len, RDA_GEN_MAX_CONFIG_FILE + 1 - len);
    if (r < 0 && (errno == EINTR || (fifo && errno == EAGAIN))) continue;
    if (r < 0) bad = errno != 0 ? errno : EIO;
    if (r <= 0) break;
    len += (size_t)r;
  }
  close(fd);
  rda_status s;
  if (late) {
    char secs[32];
    snprintf(secs, sizeof secs, "%g", g->time_limit);
    s = rda_gen_fail_fmt(err, RDA_ERR_IO,
                         "%s: cannot read: the pipe was not written and closed within the time "
                         "limit (%s s)",
                         path, secs);
  } else if (bad)
    s = rda_gen_fail_fmt(err, RDA_ERR_IO, "%s: cannot read: %s", path, strerror(bad));
  else if (len > RDA_GEN_MAX_CONFIG_FILE)
    s = rda_gen_fail_fmt(err, RDA_ERR_CONFIG, "%s: larger than %d MiB: not a config", path,
                         RDA_GEN_MAX_CONFIG_FILE >> 20);
  else
    s = rda_gen_config_text(g, buf, len, path, out, err);
  free(buf);
  return s;
}

/* ---- hardware ---------------------------------------------------------------------------- */

typedef struct rda_gen_hw_ctx {
  int arch;
  rda_hw *out;
  rda_err *err;
  rda_status status;
} rda_gen_hw_ctx;

static void rda_gen_read_hw(lua_State *L, int t, rda_hw *o) {
  memset(o, 0, sizeof *o);
  snprintf(o->name, sizeof o->name, "%s", rda_gen_str_field(L, t, "name"));
  o->arch = (int)rda_gen_int_field(L, t, "arch", 1, INT_MAX);
  o->sm_count = (int)rda_gen_int_field(L, t, "sm_count", 1, INT_MAX);
  o->smem_per_block = (int)rda_gen_int_field(L, t, "smem_per_block", 1, INT_MAX);
  o->smem_per_sm = (int)rda_gen_int_field(L, t, "smem_per_sm", 1, INT_MAX);
  o->regs_per_sm = (int)rda_gen_int_field(L, t, "regs_per_sm", 1, INT_MAX);
  o->regs_per_block = (int)rda_gen_int_field(L, t, "regs_per_block", 1, INT_MAX);
  o->max_threads_per_sm = (int)rda_gen_int_field(L, t, "max_threads_per_sm", 1, INT_MAX);
  o->live = rda_gen_bool_field(L, t, "live");
}

static int rda_gen_p_hw(lua_State *L) {
  rda_gen_hw_ctx *c = lua_touserdata(L, 1);
  rda_gen_push_bridge(L, "hw");
  lua_pushinteger(L, c->arch);
  lua_call(L, 1, 2);
  if (lua_isnil(L, -2)) {
    c->status =
        rda_gen_fail_line(c->err, RDA_ERR_INVALID_ARGUMENT, luaL_optstring(L, -1, "unknown arch"));
    return 0;
  }
  lua_pop(L, 1);
  rda_gen_read_hw(L, lua_gettop(L), c->out);
  c->status = RDA_OK;
  return 0;
}

rda_status rda_gen_hw_builtin(rda_gen *g, int arch, rda_hw *out, rda_err *err) {
  if (g == NULL || out == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_gen_hw_builtin: NULL argument");
  rda_gen_hw_ctx c = {arch, out, err, RDA_ERR_INTERNAL};
  const rda_status s = rda_gen_protected(g, rda_gen_p_hw, &c, RDA_ERR_INTERNAL, err);
  return s != RDA_OK ? s : c.status;
}

/* ---- plan -------------------------------------------------------------------------------- */

typedef struct rda_gen_plan_ctx {
  const rda_config *cfg;
  const rda_hw *hw;
  rda_plan_k *out;
  rda_err *err;
  rda_status status;
  int backward; /* RDA_PLAN_BACKWARD was asked for */
  int atomic;   /* RDA_PLAN_BACKWARD_ATOMIC too */
  int wgmma;    /* RDA_PLAN_WGMMA, or RDA_WGMMA=1 */
  /* Tuning: the user's database (NULL: none) and its name, a forced tile (or NULL). */
  const char *user_db, *user_db_name;
  const rda_gen_force *force;
  /* rda_gen_tune_tasks: the tasks read back */
  rda_tune_task *tasks;
  int ntasks;
  /* rda_gen_tune_merge: the old database, the outcomes and the new text */
  const char *old_db, *old_db_name;
  const rda_tune_outcome *outcomes;
  int noutcomes;
  const rda_tune_meta *meta;
  char *text;
} rda_gen_plan_ctx;

static void rda_gen_push_list(lua_State *L, const int64_t *v, int n) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushinteger(L, (lua_Integer)v[i]);
    lua_seti(L, -2, i + 1);
  }
}

static void rda_gen_push_config(lua_State *L, const rda_config *c) {
  lua_createtable(L, 0, 9);
  lua_pushinteger(L, c->heads);
  lua_setfield(L, -2, "heads");
  lua_pushinteger(L, c->kv_heads);
  lua_setfield(L, -2, "kv_heads");
  lua_pushinteger(L, c->head_dim);
  lua_setfield(L, -2, "head_dim");
  lua_pushstring(L, rda_dtype_name(c->dtype));
  lua_setfield(L, -2, "dtype");
  rda_gen_push_list(L, c->segments, c->nbranch);
  lua_setfield(L, -2, "segments");
  rda_gen_push_list(L, c->dilations, c->nbranch);
  lua_setfield(L, -2, "dilations");
  lua_pushstring(L, rda_offsets_name(c->offsets));
  lua_setfield(L, -2, "offsets");
  lua_pushboolean(L, c->causal);
  lua_setfield(L, -2, "causal");
  lua_pushnumber(L, c->scale);
  lua_setfield(L, -2, "scale");
}

static void rda_gen_push_hw(lua_State *L, const rda_hw *h) {
  lua_createtable(L, 0, 9);
  lua_pushstring(L, h->name);
  lua_setfield(L, -2, "name");
#define RDA_GEN_SET_INT(field)  \
  lua_pushinteger(L, h->field); \
  lua_setfield(L, -2, #field)
  RDA_GEN_SET_INT(arch);
  RDA_GEN_SET_INT(sm_count);
  RDA_GEN_SET_INT(smem_per_block);
  RDA_GEN_SET_INT(smem_per_sm);
  RDA_GEN_SET_INT(regs_per_sm);
  RDA_GEN_SET_INT(regs_per_block);
  RDA_GEN_SET_INT(max_threads_per_sm);
#undef RDA_GEN_SET_INT
  lua_pushboolean(L, h->live);
  lua_setfield(L, -2, "live");
  lua_pushboolean(L, h->emulated);
  lua_setfield(L, -2, "emulated");
}

static void rda_gen_read_variant(lua_State *L, int t, rda_variant *v) {
  const char *name = rda_gen_str_field(L, t, "name");
  const char *kind = rda_gen_str_field(L, t, "kind");
  if (strlen(name) >= sizeof v->name || strlen(kind) >= sizeof v->kind)
    luaL_error(L, "generator returned an over-long variant name or kind: %s", name);
  strcpy(v->name, name);
  strcpy(v->kind, kind);
  v->threads = (int)rda_gen_int_field(L, t, "threads", 1, 1024);
  v->block_m = (int)rda_gen_int_field(L, t, "block_m", 0, INT_MAX);
  v->block_n = (int)rda_gen_int_field(L, t, "block_n", 0, INT_MAX);
  v->smem_bytes = (int)rda_gen_int_field(L, t, "smem_bytes", 0, INT_MAX);
  lua_getfield(L, t, "tile");
  const char *tile = lua_tostring(L, -1);
  if (tile != NULL && strlen(tile) >= sizeof v->tile)
    luaL_error(L, "generator returned an over-long tile name for %s", name);
  snprintf(v->tile, sizeof v->tile, "%s", tile != NULL ? tile : "");
  lua_pop(L, 1);
  v->tuned = rda_gen_bool_field(L, t, "tuned");
  size_t len;
  lua_getfield(L, t, "source");
  const char *src = lua_tolstring(L, -1, &len);
  if (src == NULL) luaL_error(L, "generator returned no source for %s", name);
  v->source = malloc(len + 1);
  if (v->source == NULL) luaL_error(L, "out of memory copying the source of %s", name);
  memcpy(v->source, src, len + 1);
  lua_pop(L, 1);
}

/* An optional variant index field of table s (1-based in Lua): 0-based, or -1 when nil. */
static int rda_gen_opt_kernel(lua_State *L, int s, const char *key, const rda_plan_k *o) {
  lua_getfield(L, s, key);
  const int has = !lua_isnil(L, -1);
  lua_pop(L, 1);
  return has ? (int)rda_gen_int_field(L, s, key, 1, o->nvariants) - 1 : -1;
}

/* The backward part of a plan (gen/plan.lua's add_backward). */
static void rda_gen_read_bwd(lua_State *L, int t, const rda_config *cfg, rda_plan_k *o) {
  lua_getfield(L, t, "bwd_steps");
  if (!lua_istable(L, -1) || luaL_len(L, -1) != o->nsteps)
    luaL_error(L, "generator returned no backward step per branch");
  for (int i = 0; i < o->nsteps; i++) {
    lua_geti(L, -1, i + 1);
    const int s = lua_gettop(L);
    rda_bwd_step *st = &o->bwd_steps[i];
    st->dkdv_kernel = (int)rda_gen_int_field(L, s, "dkdv_kernel", 1, o->nvariants) - 1;
    st->dq_kernel = (int)rda_gen_int_field(L, s, "dq_kernel", 1, o->nvariants) - 1;
    st->dkdv_atomic_kernel = -1;
    lua_getfield(L, s, "dkdv_atomic_kernel");
    const int has_atomic = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (has_atomic)
      st->dkdv_atomic_kernel =
          (int)rda_gen_int_field(L, s, "dkdv_atomic_kernel", 1, o->nvariants) - 1;
    st->dkdv_ring_kernel = rda_gen_opt_kernel(L, s, "dkdv_ring_kernel", o);
    st->dq_ring_kernel = rda_gen_opt_kernel(L, s, "dq_ring_kernel", o);
    st->dsplit = (int)rda_gen_int_field(L, s, "dsplit", 1, 16);
    st->branch = (int)rda_gen_int_field(L, s, "branch", 0, cfg->nbranch - 1);
    st->head0 = (int)rda_gen_int_field(L, s, "head0", 0, cfg->heads - 1);
    st->nheads = (int)rda_gen_int_field(L, s, "nheads", 1, cfg->heads - st->head0);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  o->bwd_prep_kernel = (int)rda_gen_int_field(L, t, "bwd_prep_kernel", 1, o->nvariants) - 1;
  o->has_bwd = 1;
}

/* Pushes bridge.lua's `tuning` argument: { user, user_name, force = {kind, branch, tile} }. */
static void rda_gen_push_tuning(lua_State *L, const rda_gen_plan_ctx *c) {
  lua_createtable(L, 0, 3);
  if (c->user_db != NULL) {
    lua_pushstring(L, c->user_db);
    lua_setfield(L, -2, "user");
  }
  if (c->user_db_name != NULL && c->user_db_name[0] != '\0') {
    lua_pushstring(L, c->user_db_name);
    lua_setfield(L, -2, "user_name");
  }
  if (c->force != NULL) {
    lua_createtable(L, 0, 3);
    lua_pushstring(L, c->force->kind);
    lua_setfield(L, -2, "kind");
    lua_pushinteger(L, c->force->branch);
    lua_setfield(L, -2, "branch");
    lua_pushstring(L, c->force->tile);
    lua_setfield(L, -2, "tile");
    lua_setfield(L, -2, "force");
  }
}

/* The three results of a bridge call on top of the stack (gen/bridge.lua): 1 when the first is
 * not nil; else 0 with c->status set from the message, RDA_ERR_CONFIG when the third is
 * "config" (a tuning database that does not load or check), `fail` otherwise. */
static int rda_gen_bridge_ok(lua_State *L, rda_gen_plan_ctx *c, rda_status fail,
                             const char *fallback) {
  if (!lua_isnil(L, -3)) return 1;
  const int config = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), "config") == 0;
  c->status =
      rda_gen_fail_line(c->err, config ? RDA_ERR_CONFIG : fail, luaL_optstring(L, -2, fallback));
  return 0;
}

/* Calls bridge.<fn>(cfg, profile, backward, atomic-or-omitted, wgmma, tuning) with the 3-result
 * convention of gen/bridge.lua: the result, or nil, message and "config" for a tuning database
 * that does not load or check (RDA_ERR_CONFIG), or nil and message (`fail`). Returns 1 with the
 * result on the stack, or 0 with c->status set. */
static int rda_gen_call_planner(lua_State *L, rda_gen_plan_ctx *c, const char *fn, int atomic_arg,
                                rda_status fail) {
  rda_gen_push_bridge(L, fn);
  rda_gen_push_config(L, c->cfg);
  rda_gen_push_hw(L, c->hw);
  lua_pushboolean(L, c->backward);
  if (atomic_arg) lua_pushboolean(L, c->atomic);
  lua_pushboolean(L, c->wgmma);
  rda_gen_push_tuning(L, c);
  lua_call(L, atomic_arg ? 6 : 5, 3);
  if (!rda_gen_bridge_ok(L, c, fail, "no plan fits")) return 0;
  lua_pop(L, 2);
  return 1;
}

static int rda_gen_p_plan(lua_State *L) {
  rda_gen_plan_ctx *c = lua_touserdata(L, 1);
  rda_plan_k *o = c->out;
  if (!rda_gen_call_planner(L, c, "plan", 1, RDA_ERR_UNSUPPORTED)) return 0;
  const int t = lua_gettop(L);

  lua_getfield(L, t, "variants");
  const lua_Integer nv = luaL_len(L, -1);
  if (nv < 1 || nv > 64) return luaL_error(L, "generator returned %I variants", nv);
  o->variants = calloc((size_t)nv, sizeof *o->variants);
  if (o->variants == NULL) return luaL_error(L, "out of memory for %I variants", nv);
  o->nvariants = (int)nv;
  for (int i = 0; i < o->nvariants; i++) {
    lua_geti(L, -1, i + 1);
    rda_gen_read_variant(L, lua_gettop(L), &o->variants[i]);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);

  lua_getfield(L, t, "steps");
  const lua_Integer ns = luaL_len(L, -1);
  if (ns != c->cfg->nbranch) return luaL_error(L, "generator returned %I steps", ns);
  o->nsteps = (int)ns;
  for (int i = 0; i < o->nsteps; i++) {
    lua_geti(L, -1, i + 1);
    const int s = lua_gettop(L);
    rda_step *st = &o->steps[i];
    st->kernel = (int)rda_gen_int_field(L, s, "kernel", 1, o->nvariants) - 1;
    st->branch = (int)rda_gen_int_field(L, s, "branch", 0, c->cfg->nbranch - 1);
    st->head0 = (int)rda_gen_int_field(L, s, "head0", 0, c->cfg->heads - 1);
    st->nheads = (int)rda_gen_int_field(L, s, "nheads", 1, c->cfg->heads - st->head0);
    lua_getfield(L, s, "ring_kernel");
    const int has_ring = !lua_isnil(L, -1);
    lua_pop(L, 1);
    st->ring_kernel =
        has_ring ? (int)rda_gen_int_field(L, s, "ring_kernel", 1, o->nvariants) - 1 : -1;
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  o->init_kernel = (int)rda_gen_int_field(L, t, "init_kernel", 1, o->nvariants) - 1;
  o->cast_kernel = (int)rda_gen_int_field(L, t, "cast_kernel", 1, o->nvariants) - 1;
  o->ring_pack_kernel = (int)rda_gen_int_field(L, t, "ring_pack_kernel", 1, o->nvariants) - 1;
  o->ring_add_kernel = (int)rda_gen_int_field(L, t, "ring_add_kernel", 1, o->nvariants) - 1;
  if (c->backward) rda_gen_read_bwd(L, t, c->cfg, o);
  c->status = RDA_OK;
  return 0;
}

/* The checks SPEC §3 validation guarantees, for configs that did not come from it. */
static rda_status rda_gen_check_config(const rda_config *c, rda_err *err) {
  static const int dims[] = {32, 64, 96, 128, 256};
  int dim_ok = 0;
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) dim_ok |= c->head_dim == dims[i];
  if (c->nbranch < 1 || c->nbranch > RDA_MAX_BRANCHES || c->heads < 1 || c->kv_heads < 1 ||
      c->kv_heads > c->heads || c->heads % c->kv_heads != 0 || !dim_ok ||
      (c->dtype != RDA_DTYPE_BF16 && c->dtype != RDA_DTYPE_FP16) || c->offsets < RDA_OFFSETS_MOD ||
      c->offsets > RDA_OFFSETS_GROUP || (c->offsets == RDA_OFFSETS_GROUP && c->heads < c->nbranch))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "rda_gen_plan: the config was not validated (SPEC §3)");
  /* The scale may have either sign (SPEC §1); it is resolved, so never 0, and scale * log2(e)
   * becomes an fp32 constant of the kernels. */
  if (c->scale == 0 || !rda_config_scale_fits(c->scale))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                       "rda_gen_plan: scale = %g: must be finite, nonzero and at most %.8g in "
                       "magnitude (scale * log2(e) must fit in fp32)",
                       c->scale, rda_config_scale_max());
  for (int i = 0; i < c->nbranch; i++) {
    const char *key = NULL;
    long long v = 0;
    if (!rda_config_size_ok(c->segments[i]))
      key = "segments", v = (long long)c->segments[i];
    else if (!rda_config_size_ok(c->dilations[i]))
      key = "dilations", v = (long long)c->dilations[i];
    if (key != NULL)
      return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT,
                         "rda_gen_plan: %s[%d] = %lld: must be from 1 to 2^40 = %lld", key, i, v,
                         RDA_CONFIG_MAX_SIZE);
  }
  return RDA_OK;
}

int rda_gen_wgmma_env(rda_err *err) {
  const char *v = getenv("RDA_WGMMA");
  if (v == NULL || v[0] == '\0' || strcmp(v, "0") == 0) return 0;
  if (strcmp(v, "1") == 0) return 1;
  rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "RDA_WGMMA='%s': expected 0 or 1", v);
  return -1;
}

rda_status rda_gen_plan(rda_gen *g, const rda_config *cfg, const rda_hw *hw, rda_plan_k *out,
                        rda_err *err) {
  return rda_gen_plan_ex(g, cfg, hw, 0, out, err);
}

rda_status rda_gen_plan_ex(rda_gen *g, const rda_config *cfg, const rda_hw *hw, unsigned flags,
                           rda_plan_k *out, rda_err *err) {
  return rda_gen_plan_forced(g, cfg, hw, flags, NULL, out, err);
}

/* The checks every planning entry point makes, then c filled for the call: flags, RDA_WGMMA,
 * and, when user_db is not NULL, the user's tuning database read (*user_db: malloc'd text or
 * NULL, freed by the caller; tune_merge plans nothing from it and passes NULL). */
static rda_status rda_gen_plan_setup(const char *fn, rda_gen *g, const rda_config *cfg,
                                     const rda_hw *hw, unsigned flags, rda_gen_plan_ctx *c,
                                     char **user_db, char *user_db_name, size_t name_cap,
                                     rda_err *err) {
  if (user_db != NULL) *user_db = NULL;
  if (g == NULL || cfg == NULL || hw == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  RDA_TRY(rda_gen_check_config(cfg, err));
  if (hw->smem_per_block < 1 || hw->max_threads_per_sm < 1 || hw->sm_count < 1)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "%s: incomplete hardware profile", fn);
  const int wgmma_env = rda_gen_wgmma_env(err);
  if (wgmma_env < 0) return RDA_ERR_INVALID_ARGUMENT;
  if (user_db != NULL) RDA_TRY(rda_tuning_db_read(user_db, user_db_name, name_cap, err));
  memset(c, 0, sizeof *c);
  c->cfg = cfg;
  c->hw = hw;
  c->err = err;
  c->status = RDA_ERR_INTERNAL;
  c->backward = (flags & RDA_PLAN_BACKWARD) != 0;
  c->atomic = (flags & RDA_PLAN_BACKWARD_ATOMIC) != 0;
  c->wgmma = (flags & RDA_PLAN_WGMMA) != 0 || wgmma_env == 1;
  if (user_db != NULL) {
    c->user_db = *user_db;
    c->user_db_name = user_db_name;
  }
  return RDA_OK;
}

rda_status rda_gen_plan_forced(rda_gen *g, const rda_config *cfg, const rda_hw *hw,
                               unsigned flags, const rda_gen_force *force, rda_plan_k *out,
                               rda_err *err) {
  if (out == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_gen_plan: NULL argument");
  memset(out, 0, sizeof *out);
  if (force != NULL && (force->kind == NULL || force->tile == NULL || force->branch < 0))
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_gen_plan: incomplete forced tile");
  rda_gen_plan_ctx c;
  char *user_db;
  char user_db_name[4096];
  RDA_TRY(rda_gen_plan_setup("rda_gen_plan", g, cfg, hw, flags, &c, &user_db, user_db_name,
                             sizeof user_db_name, err));
  out->cfg = *cfg;
  out->hw = *hw;
  c.out = out;
  c.force = force;
  rda_status s = rda_gen_protected(g, rda_gen_p_plan, &c, RDA_ERR_INTERNAL, err);
  if (s == RDA_OK) s = c.status;
  free(user_db);
  if (s != RDA_OK) rda_plan_k_free(out);
  return s;
}

/* ---- tuning tasks and merging ------------------------------------------------------------ */

static void rda_gen_copy_name(lua_State *L, int t, const char *key, char *dst, size_t cap) {
  const char *v = rda_gen_str_field(L, t, key);
  if (strlen(v) >= cap) luaL_error(L, "generator returned an over-long %s: %s", key, v);
  memcpy(dst, v, strlen(v) + 1);
}

static int rda_gen_p_tune_tasks(lua_State *L) {
  rda_gen_plan_ctx *c = lua_touserdata(L, 1);
  if (!rda_gen_call_planner(L, c, "tune_tasks", 0, RDA_ERR_UNSUPPORTED)) return 0;
  const int t = lua_gettop(L);
  const lua_Integer n = luaL_len(L, t);
  if (n < 1 || n > 3 * RDA_MAX_BRANCHES) return luaL_error(L, "generator returned %I tasks", n);
  c->tasks = calloc((size_t)n, sizeof *c->tasks);
  if (c->tasks == NULL) return luaL_error(L, "out of memory for %I tuning tasks", n);
  c->ntasks = (int)n;
  for (int i = 0; i < c->ntasks; i++) {
    rda_tune_task *k = &c->tasks[i];
    lua_geti(L, t, i + 1);
    const int e = lua_gettop(L);
    rda_gen_copy_name(L, e, "kind", k->kind, sizeof k->kind);
    rda_gen_copy_name(L, e, "key", k->key, sizeof k->key);
    rda_gen_copy_name(L, e, "chosen", k->chosen, sizeof k->chosen);
    k->branch = (int)rda_gen_int_field(L, e, "branch", 0, c->cfg->nbranch - 1);
    k->tuned = rda_gen_bool_field(L, e, "tuned");
    lua_getfield(L, e, "candidates");
    const lua_Integer nc = luaL_len(L, -1);
    if (nc < 1 || nc > RDA_TUNE_MAX_CANDIDATES)
      return luaL_error(L, "generator returned %I candidates for %s", nc, k->key);
    k->ncandidates = (int)nc;
    for (int j = 0; j < k->ncandidates; j++) {
      lua_geti(L, -1, j + 1);
      const char *name = lua_tostring(L, -1);
      if (name == NULL || strlen(name) >= sizeof k->candidates[j])
        return luaL_error(L, "generator returned a bad candidate name for %s", k->key);
      memcpy(k->candidates[j], name, strlen(name) + 1);
      lua_pop(L, 1);
    }
    lua_pop(L, 2);
  }
  c->status = RDA_OK;
  return 0;
}

rda_status rda_gen_tune_tasks(rda_gen *g, const rda_config *cfg, const rda_hw *hw, unsigned flags,
                              rda_tune_task **out, int *n, rda_err *err) {
  if (out == NULL || n == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_gen_tune_tasks: NULL argument");
  *out = NULL;
  *n = 0;
  rda_gen_plan_ctx c;
  char *user_db;
  char user_db_name[4096];
  RDA_TRY(rda_gen_plan_setup("rda_gen_tune_tasks", g, cfg, hw, flags, &c, &user_db,
                             user_db_name, sizeof user_db_name, err));
  rda_status s = rda_gen_protected(g, rda_gen_p_tune_tasks, &c, RDA_ERR_INTERNAL, err);
  if (s == RDA_OK) s = c.status;
  free(user_db);
  if (s != RDA_OK) {
    free(c.tasks);
    return s;
  }
  *out = c.tasks;
  *n = c.ntasks;
  return RDA_OK;
}

static int rda_gen_p_tune_merge(lua_State *L) {
  rda_gen_plan_ctx *c = lua_touserdata(L, 1);
  rda_gen_push_bridge(L, "tune_merge");
  if (c->old_db != NULL)
    lua_pushstring(L, c->old_db);
  else
    lua_pushnil(L);
  lua_pushstring(L, c->old_db_name != NULL ? c->old_db_name : "tuning database");
  rda_gen_push_config(L, c->cfg);
  rda_gen_push_hw(L, c->hw);
  lua_pushboolean(L, c->backward);
  lua_pushboolean(L, c->wgmma);
  lua_createtable(L, c->noutcomes, 0);
  for (int i = 0; i < c->noutcomes; i++) {
    const rda_tune_outcome *r = &c->outcomes[i];
    lua_createtable(L, 0, 2);
    lua_pushinteger(L, (lua_Integer)r->task + 1);
    lua_setfield(L, -2, "task");
    lua_createtable(L, r->nranked, 0);
    for (int j = 0; j < r->nranked && j < RDA_TUNE_MAX_CANDIDATES; j++) {
      lua_createtable(L, 0, 2);
      lua_pushstring(L, r->ranked[j].tile);
      lua_setfield(L, -2, "tile");
      lua_pushnumber(L, r->ranked[j].us);
      lua_setfield(L, -2, "us");
      lua_seti(L, -2, j + 1);
    }
    lua_setfield(L, -2, "ranking");
    lua_seti(L, -2, i + 1);
  }
  lua_createtable(L, 0, 5);
  lua_pushstring(L, c->meta->device != NULL ? c->meta->device : "");
  lua_setfield(L, -2, "device");
  lua_pushstring(L, c->meta->date != NULL ? c->meta->date : "");
  lua_setfield(L, -2, "date");
  lua_pushstring(L, RDA_VERSION_STRING);
  lua_setfield(L, -2, "rda");
  lua_pushinteger(L, c->meta->n);
  lua_setfield(L, -2, "n");
  lua_pushinteger(L, c->meta->batch);
  lua_setfield(L, -2, "batch");
  lua_call(L, 8, 3);
  if (!rda_gen_bridge_ok(L, c, RDA_ERR_INVALID_ARGUMENT, "the outcomes do not merge")) return 0;
  size_t len;
  const char *text = lua_tolstring(L, -3, &len);
  if (text == NULL) return luaL_error(L, "tune_merge returned no text");
  c->text = malloc(len + 1);
  if (c->text == NULL) return luaL_error(L, "out of memory for the tuning database text");
  memcpy(c->text, text, len + 1);
  c->status = RDA_OK;
  return 0;
}

rda_status rda_gen_tune_merge(rda_gen *g, const rda_config *cfg, const rda_hw *hw, unsigned flags,
                              const char *old_text, const char *old_name,
                              const rda_tune_outcome *outcomes, int noutcomes,
                              const rda_tune_meta *meta, char **text, rda_err *err) {
  if (text == NULL || meta == NULL || (outcomes == NULL && noutcomes > 0) || noutcomes < 0)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_gen_tune_merge: NULL argument");
  *text = NULL;
  rda_gen_plan_ctx c;
  RDA_TRY(rda_gen_plan_setup("rda_gen_tune_merge", g, cfg, hw, flags, &c, NULL, NULL, 0, err));
  c.old_db = old_text; /* the database to merge into is the caller's, not the user's file */
  c.old_db_name = old_name;
  c.outcomes = outcomes;
  c.noutcomes = noutcomes;
  c.meta = meta;
  rda_status s = rda_gen_protected(g, rda_gen_p_tune_merge, &c, RDA_ERR_INTERNAL, err);
  if (s == RDA_OK) s = c.status;
  if (s != RDA_OK) {
    free(c.text);
    return s;
  }
  *text = c.text;
  return RDA_OK;
}

void rda_plan_k_free(rda_plan_k *p) {
  if (p == NULL) return;
  for (int i = 0; i < p->nvariants; i++) free(p->variants[i].source);
  free(p->variants);
  p->variants = NULL;
  p->nvariants = 0;
  p->nsteps = 0;
  p->has_bwd = 0;
}

/* ---- scripts ----------------------------------------------------------------------------- */

rda_status rda_gen_run_script(rda_gen *g, const char *path, rda_err *err) {
  if (g == NULL || path == NULL)
    return rda_err_set(err, RDA_ERR_INVALID_ARGUMENT, "rda_gen_run_script: NULL argument");
  g->trace[0] = '\0';
  if (luaL_loadfilex(g->L, path, "t") != LUA_OK) {
    const char *msg = lua_tostring(g->L, -1);
    snprintf(g->trace, sizeof g->trace, "%s", msg != NULL ? msg : "?");
    rda_status s = rda_gen_fail_line(err, RDA_ERR_IO, msg != NULL ? msg : path);
    lua_pop(g->L, 1);
    return s;
  }
  const rda_status s = rda_gen_docall(g, 0, 0, RDA_ERR_INTERNAL, err);
  lua_gc(g->L, LUA_GCCOLLECT);
  return s;
}
