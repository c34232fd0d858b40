/* lib/device/cpu/k_table.c: the CPU device's kernel table (dt_kernels_cpu): the
 * host loops, one file a group. They keep the arithmetic the ops' host loops
 * have always had (f64 accumulation where they sum), so a CPU run's numbers do
 * not depend on the table being there. */
#include "config.h"

#include "device/kernels.h"

extern const dt_kern_pw dt_cpu_pw;
extern const dt_kern_rows dt_cpu_rows;
extern const dt_kern_attn dt_cpu_attn;
extern const dt_kern_layout dt_cpu_layout;
extern const dt_kern_optim dt_cpu_optim;

/* bf16_as_f32: the host loops are written for f32 and f64. */
const dt_kernels dt_kernels_cpu = {"cpu", &dt_cpu_pw, &dt_cpu_rows, &dt_cpu_attn, &dt_cpu_layout,
                                   &dt_cpu_optim, true, false};
