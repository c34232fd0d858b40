/* lib/core/dtype.c: dtype sizes, names, parsing and bf16 conversion. */
#include "config.h"

#include <string.h>

#include "core/core.h"

size_t dt_dtype_size(dt_dtype t) {
  switch (t) {
    case DT_F32: return 4;
    case DT_F64: return 8;
    case DT_BF16: return 2;
    case DT_I64: return 8;
    default: return 0;
  }
}

const char *dt_dtype_name(dt_dtype t) {
  switch (t) {
    case DT_F32: return "f32";
    case DT_F64: return "f64";
    case DT_BF16: return "bf16";
    case DT_I64: return "i64";
    default: return "?";
  }
}

dt_status dt_dtype_parse(const char *s, dt_dtype *out) {
  if (!s) return DT_ERR_INVALID;
  if (!strcmp(s, "f32") || !strcmp(s, "float32")) *out = DT_F32;
  else if (!strcmp(s, "f64") || !strcmp(s, "float64")) *out = DT_F64;
  else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *out = DT_BF16;
  else if (!strcmp(s, "i64") || !strcmp(s, "int64")) *out = DT_I64;
  else return DT_ERR_INVALID;
  return DT_OK;
}

dt_bf16 dt_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  dt_bf16 h;
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    h.bits = (uint16_t)((u >> 16) | 0x0040u); /* keep NaN a (quiet) NaN */
    return h;
  }
  /* round to nearest, ties to even: add 0x7fff plus the lowest kept bit */
  u += 0x7fffu + ((u >> 16) & 1u);
  h.bits = (uint16_t)(u >> 16);
  return h;
}

float dt_bf16_to_f32(dt_bf16 h) {
  uint32_t u = (uint32_t)h.bits << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
