/* lib/dtensor.h: the one public header of libdtensor, the shardbench runtime,
 * installed as <dtensor/dtensor.h>. Layers, lowest first (each may use only
 * those before it): core (status, ctx, dtypes, arrays, allocator, RNG); device
 * (cpu | cuda compute) and comm (collectives with a ledger; threads | mpi), which
 * know nothing of each other; launch (ranks, their contexts, communicators and
 * devices); mesh (DeviceMesh); dtensor (placements, DTensor, redistribute); ops
 * (sharding propagation and kernels); autograd (the tape); nn (Llama 3);
 * parallel (tensor-parallel styles and plan files). */
#ifndef DT_DTENSOR_H
#define DT_DTENSOR_H
#include "core/core.h"
#include "device/device.h"
#include "device/kernels.h"
#include "device/xfer.h"
#include "comm/comm.h"
#include "comm/comm_nccl.h"
#include "launch/launch.h"
#include "mesh/mesh.h"
#include "dtensor/dtensor.h"
#include "ops/ops.h"
#include "autograd/autograd.h"
#include "nn/nn.h"
#include "parallel/parallel.h"
#include "parallel/trainer.h"
#endif
