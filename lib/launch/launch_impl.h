/* lib/launch/launch_impl.h: what the launchers (launch_threads.c, launch_mpi.c)
 * share. Private to lib/launch: not installed. */
#ifndef DT_LAUNCH_IMPL_H
#define DT_LAUNCH_IMPL_H

#include "../comm/comm.h"

/* When dev is not the CPU, installs on world the comm layer's view of it (see
 * dt_comm_mem): which buffers are its memory, copies, the reduce kernel, sync.
 * DT_ERR_UNSUPPORTED (recorded) when the device has no layout kernels. */
dt_status dt_launch_install_comm_mem(dt_comm *world, dt_device *dev);

#endif
