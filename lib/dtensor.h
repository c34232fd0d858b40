/* lib/dtensor.h: the one public header of libdtensor, the shardbench runtime.
 * Layers, lowest first: core (status, ctx, dtypes, arrays, allocator, RNG),
 * device (cpu | cuda compute), comm (collectives with a ledger; threads | mpi),
 * mesh (DeviceMesh). Higher layers (dtensor, ops, autograd, nn, parallel) join
 * this header as they land. */
#ifndef DT_DTENSOR_H
#define DT_DTENSOR_H
#include "core/core.h"
#include "device/device.h"
#include "comm/comm.h"
#include "comm/launch.h"
#include "mesh/mesh.h"
#include "dtensor/dtensor.h"
#include "ops/ops.h"
#include "autograd/autograd.h"
#include "nn/nn.h"
#include "parallel/parallel.h"
#endif
