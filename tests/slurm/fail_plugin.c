// SPDX-License-Identifier: Apache-2.0
//
// A SPANK plugin for the Slurm test harness: it fails on purpose at one
// chosen callback, so a test can see what srun's exit code and the job's
// state are when a plugin fails there.
//
//   gcc -shared -fPIC -o fail_plugin.so fail_plugin.c      (needs libslurm-dev)
//   plugstack.conf:  optional /path/fail_plugin.so [fail_at=POINT]
//   srun --fail-at=POINT ...      (or NVTS_FAIL_AT=POINT in srun's environment)
//
// POINT is one of
//   opt             the --fail-at option callback (srun side: "local")
//   opt_remote      the same callback, but only where it runs in slurmstepd
//   init_local      slurm_spank_init in srun            (option not yet seen:
//   init_remote     slurm_spank_init in slurmstepd       plugstack arg or env only)
//   post_opt_local  slurm_spank_init_post_opt in srun
//   post_opt_remote slurm_spank_init_post_opt in slurmstepd
//   user_init       slurm_spank_user_init               (slurmstepd, as root)
//   task_init_priv  slurm_spank_task_init_privileged    (task, as root)
//   task_init       slurm_spank_task_init               (task, as the user)
//   task_post_fork  slurm_spank_task_post_fork          (slurmstepd)
//   task_exit       slurm_spank_task_exit               (slurmstepd)
//   exit_local      slurm_spank_exit in srun
//   exit_remote     slurm_spank_exit in slurmstepd
// Each failing callback logs "fail_plugin: failing in <POINT>" with
// slurm_error and returns -1 (ESPANK_ERROR). Every callback it passes through
// also logs "fail_plugin: at <callback>" with slurm_info when NVTS_FAIL_TRACE
// is set in srun's environment, so a test can see which callbacks ran where.
#include <slurm/spank.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

SPANK_PLUGIN(nvts_fail, 1);

static char fail_at[64];
static int trace;

static void set_point(const char *value) {
  if (value != NULL && value[0] != '\0') snprintf(fail_at, sizeof fail_at, "%s", value);
}

// The point from the job's environment: getenv in srun, spank_getenv in
// slurmstepd (whose own environment is slurmd's, not the job's).
static void point_from_env(spank_t sp) {
  char buf[64];
  if (spank_remote(sp)) {
    if (fail_at[0] == '\0' && spank_getenv(sp, "NVTS_FAIL_AT", buf, sizeof buf) == ESPANK_SUCCESS) set_point(buf);
    if (spank_getenv(sp, "NVTS_FAIL_TRACE", buf, sizeof buf) == ESPANK_SUCCESS) trace = 1;
  } else {
    if (fail_at[0] == '\0') set_point(getenv("NVTS_FAIL_AT"));
    if (getenv("NVTS_FAIL_TRACE") != NULL) trace = 1;
  }
}

static int check(spank_t sp, const char *point, const char *callback) {
  if (trace) slurm_info("fail_plugin: at %s (%s)", callback, spank_remote(sp) ? "remote" : "local");
  if (strcmp(fail_at, point) == 0) {
    slurm_error("fail_plugin: failing in %s", point);
    return -1;
  }
  return 0;
}

static int opt_cb(int val, const char *optarg, int remote) {
  (void)val;
  set_point(optarg);
  if (strcmp(fail_at, "opt") == 0 || (remote && strcmp(fail_at, "opt_remote") == 0)) {
    slurm_error("fail_plugin: failing in %s", fail_at);
    return -1;
  }
  return 0;
}

static struct spank_option options[] = {
    {"fail-at", "POINT", "fail on purpose at POINT (test plugin)", 1, 0, opt_cb},
    SPANK_OPTIONS_TABLE_END,
};

int slurm_spank_init(spank_t sp, int ac, char **av) {
  for (int i = 0; i < ac; i++)
    if (strncmp(av[i], "fail_at=", 8) == 0) set_point(av[i] + 8);
  if (spank_context() == S_CTX_LOCAL || spank_context() == S_CTX_REMOTE) point_from_env(sp);
  if (spank_option_register(sp, options) != ESPANK_SUCCESS) return -1;
  switch (spank_context()) {
    case S_CTX_LOCAL: return check(sp, "init_local", "init");
    case S_CTX_REMOTE: return check(sp, "init_remote", "init");
    default: return 0;
  }
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av) {
  (void)ac, (void)av;
  point_from_env(sp);
  return check(sp, spank_remote(sp) ? "post_opt_remote" : "post_opt_local", "init_post_opt");
}

int slurm_spank_user_init(spank_t sp, int ac, char **av) {
  (void)ac, (void)av;
  return check(sp, "user_init", "user_init");
}

int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av) {
  (void)ac, (void)av;
  return check(sp, "task_init_priv", "task_init_privileged");
}

int slurm_spank_task_init(spank_t sp, int ac, char **av) {
  (void)ac, (void)av;
  return check(sp, "task_init", "task_init");
}

int slurm_spank_task_post_fork(spank_t sp, int ac, char **av) {
  (void)ac, (void)av;
  return check(sp, "task_post_fork", "task_post_fork");
}

int slurm_spank_task_exit(spank_t sp, int ac, char **av) {
  (void)ac, (void)av;
  return check(sp, "task_exit", "task_exit");
}

int slurm_spank_exit(spank_t sp, int ac, char **av) {
  (void)ac, (void)av;
  switch (spank_context()) {
    case S_CTX_LOCAL: return check(sp, "exit_local", "exit");
    case S_CTX_REMOTE: return check(sp, "exit_remote", "exit");
    default: return 0;
  }
}
