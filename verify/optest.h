/* verify/optest.h: helpers shared by the op tests (test_ops_*.c): a per-rank
 * context, building a DTensor from a global array, comparing dt_tensor_full of
 * a result against a global array, the central finite-difference gradient
 * check of an op's backward, and the per-mesh launch of a test body. */
#ifndef SB_OPTEST_H
#define SB_OPTEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "testutil.h"

/* One rank's view of the test: its context, the mesh and the rank-0 case count. */
typedef struct ot_rank {
  dt_ctx *ctx;
  dt_mesh *mesh;
  const char *mlabel;
  int m;
  int ms[DT_MAX_MESH_DIMS];
  long cases;
} ot_rank;

/* "[d0,d1,...]" into buf (n bytes). */
void ot_shape_str(int ndim, const int64_t *sh, char *buf, size_t n);

/* Distributes the global array v (dtype, shape ndim/sh) over R's mesh at placements pl. */
dt_status ot_make(ot_rank *R, dt_dtype dtype, int ndim, const int64_t *sh, const void *v,
                  const dt_placement *pl, dt_tensor *t);

/* dt_tensor_full(t) is f64 with shape ndim/sh and values want within tol
 * (relative, floor 1). Reports the first mismatch; returns false on one.
 * Counts one check (tu_count), like each helper here that compares. */
bool ot_check_vals(ot_rank *R, const char *what, const dt_tensor *t, int ndim, const int64_t *sh,
                   const double *want, double tol);
/* The same for an output of dtype (f64 or f32, read as double). */
bool ot_check_vals_dt(ot_rank *R, const char *what, const dt_tensor *t, dt_dtype dtype, int ndim,
                      const int64_t *sh, const double *want, double tol);

/* Reference loss evaluated on the current values of the inputs. */
typedef double (*ot_loss_fn)(void *arg);

/* grad[i] = (loss(x[i] + h) - loss(x[i] - h)) / (2 h) for each of the n
 * elements of x; x is restored after each perturbation. */
void ot_fd_grad(double *x, int64_t n, double h, ot_loss_fn loss, void *arg, double *grad);

/* An f64 global array as the gradient check sees it. */
typedef struct ot_arr {
  int ndim;
  const int64_t *sh;
  double *v;
} ot_arr;

/* Backward of op (n_in <= 3 f64 inputs in[j] at placements pl[j], attrs a) against
 * central finite differences of loss (= sum(out * G) on the current in[] values):
 * the output gradient G is placed as the output with Partial made Replicate.
 * Each input gradient must match within tol; counts one case in R->cases and
 * one check, plus one per input gradient compared. */
void ot_grad_check(ot_rank *R, const char *what, const dt_op *op, const dt_op_attrs *a, int n_in,
                   ot_arr *in, dt_placement pl[][DT_MAX_MESH_DIMS], const ot_arr *G, ot_loss_fn loss,
                   void *arg, double h, double tol);

/* Fills R and creates its mesh (dim names "dp", "tp"; "tp" alone on a 1-D mesh). */
dt_status ot_rank_open(ot_rank *R, dt_ctx *ctx, const char *label, int ndim, const int *shape);
/* Checks every host allocation since mem0 was freed, then frees the mesh. */
void ot_rank_close(ot_rank *R, size_t mem0);

/* Launches fn(arg) on the threads of a mesh of ndim/shape (timeout 60 s),
 * reporting a failed launch; returns the seconds it took. */
double ot_launch(dt_backend backend, const char *label, int ndim, const int *shape, dt_spmd_fn fn,
                 void *arg);

#endif
