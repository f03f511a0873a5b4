// The CPU backend's compute threads: one count for OpenMP and OpenBLAS, and how idle workers wait.
//
// Measured on 2 cores (docs/results/cpu_threads.md): libgomp's default spin-wait (300k spins
// between parallel regions) keeps both workers on the CPU; with one other busy process a
// preempted worker holds every decode step's barriers, and the spinning OpenMP workers and
// OpenBLAS's own pool preempt each other during prefill (decode 59 -> 18 tok/s, prefill ~3x
// slower). Short spins (GOMP_SPINCOUNT=1000) then sleeping keep the quiet-machine speed and
// yield the cores to other work (a server's HTTP threads included).
#pragma once

namespace lychee {

// The cores this process may run on (sched_getaffinity; hardware_concurrency as a fallback).
int available_cores();

// `requested` > 0 is used as is; 0 means available_cores().
int resolve_compute_threads(int requested);

// Sets the compute thread count (resolve_compute_threads(n)) for OpenMP and OpenBLAS alike and
// returns it. Call before the first forward pass; the server and the CLI both call it.
int set_compute_threads(int n);
int compute_threads();

// libgomp reads its wait policy once, when it loads (before main), so it can only be chosen
// through the environment of a fresh process. When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT
// is set, sets GOMP_SPINCOUNT=1000 and re-executes this program (/proc/self/exe) with the same
// arguments; returns only when no re-execution was needed or it failed. Call first in main().
void reexec_with_short_spin_wait(char** argv);

}  // namespace lychee
