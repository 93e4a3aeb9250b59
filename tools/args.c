/* args.c — strict number and option-value syntax for rdagen (see args.h). strtoll and strtod
 * alone would take leading white space, signs, hex and inf: each of those is refused here. */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int args_digit(char c) { return c >= '0' && c <= '9'; }

int rdagen_parse_count(const char *s, long long lo, long long hi, long long *out) {
  if (s == NULL || !args_digit(s[0])) return 0;
  for (const char *c = s; *c; c++)
    if (!args_digit(*c)) return 0;
  errno = 0;
  const long long v = strtoll(s, NULL, 10);
  if (errno != 0 || v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

int rdagen_parse_decimal(const char *s, double *out) {
  if (s == NULL) return 0;
  const char *c = s;
  int digits = 0;
  for (; args_digit(*c); c++) digits++;
  if (*c == '.')
    for (c++; args_digit(*c); c++) digits++;
  if (digits == 0) return 0;
  if (*c == 'e' || *c == 'E') {
    c++;
    if (*c == '+' || *c == '-') c++;
    if (!args_digit(*c)) return 0;
    while (args_digit(*c)) c++;
  }
  if (*c != '\0') return 0;
  const double d = strtod(s, NULL);
  if (!isfinite(d)) return 0; /* an exponent past the double range */
  *out = d;
  return 1;
}

int rdagen_parse_count_sci(const char *s, long long lo, long long hi, long long *out) {
  if (rdagen_parse_count(s, lo, hi, out)) return 1;
  double d;
  if (s == NULL || strpbrk(s, "eE") == NULL || !rdagen_parse_decimal(s, &d)) return 0;
  if (d != floor(d) || d >= 9223372036854775808.0 || d < (double)lo || d > (double)hi) return 0;
  *out = (long long)d;
  return 1;
}

int rdagen_parse_arch(const char *s) {
  long long v;
  if (s == NULL || strncmp(s, "sm_", 3) != 0) return -1;
  const size_t digits = strlen(s + 3);
  if (digits < 2 || digits > 3 || !rdagen_parse_count(s + 3, 10, 999, &v)) return -1;
  return (int)v;
}

int rdagen_option_index(const char *arg, const char *const *names, int n, const char **eq) {
  *eq = NULL;
  if (strncmp(arg, "--", 2) != 0) return -1;
  const char *name = arg + 2, *e = strchr(name, '=');
  const size_t len = e != NULL ? (size_t)(e - name) : strlen(name);
  for (int f = 0; f < n; f++)
    if (strlen(names[f]) == len && strncmp(names[f], name, len) == 0) {
      *eq = e;
      return f;
    }
  return -1;
}

const char *rdagen_option_value(int argc, char **argv, int *i, const char *eq) {
  if (eq != NULL) return eq[1] != '\0' ? eq + 1 : NULL;
  if (*i + 1 >= argc || argv[*i + 1][0] == '\0' || strncmp(argv[*i + 1], "--", 2) == 0)
    return NULL;
  return argv[++*i];
}
