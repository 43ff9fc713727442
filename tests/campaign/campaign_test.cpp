// The campaign loop against closed forms: renewal theory for restarts, exact checkpoint
// overhead without failures, Poisson counts by cause, the accounting identity, Monte Carlo
// bands, and fault-tolerant data parallelism at 100,000 GPUs.
#include <gtest/gtest.h>

#include <cmath>

#include "campaign/campaign.hpp"

namespace hetflow::campaign {
namespace {

constexpr double kNever = 1e30;  // an MTBF that never fails in a run

// A job of `gpus` GPUs, 8 per node, `replicas` replicas, 1 s iterations in every state, and
// only software failures (no repair) at job MTBF `mtbf_s`; detection and set-up free, a
// restart costs `relaunch_s`.
Job software_only_job(int gpus, int replicas, double mtbf_s, double relaunch_s) {
  Job job;
  job.gpus = gpus;
  job.nodes = gpus / 8;
  job.replicas = replicas;
  job.gpus_per_node = 8;
  job.samples_per_step = 1;
  job.times = {1, 1, 1, 1};
  Reliability& r = job.reliability;
  r = default_reliability();
  r.mtbf_s.fill(kNever);
  r.mtbf_s[static_cast<size_t>(Component::software)] = mtbf_s * gpus;  // per GPU
  r.detection_s = 0;
  r.comm_setup_s_per_rank = 0;
  r.relaunch_s = relaunch_s;
  return job;
}

// Renewal theory. Failures arrive at rate L; a checkpoint every T of compute is free; a
// failure loses the work since the last checkpoint and costs a restart of R during which
// failures may strike again (each starts the restart over). Let X be the wall time to get one
// segment of T done. From its start: with probability e^{-LT} no failure comes and X = T;
// else the first failure comes at s < T (density L e^{-Ls}), then a restart of random length
// Y, then X again afresh. So E[X] = T e^{-LT} + int_0^T s L e^{-Ls} ds + (1 - e^{-LT})(E[Y] +
// E[X]), i.e. E[X] e^{-LT} = (1 - e^{-LT})/L + (1 - e^{-LT}) E[Y]. The restart itself is a
// segment of "work" R that yields nothing when failures reset it: by the same argument
// E[Y] = (e^{LR} - 1)/L. Together E[X] = (e^{LT} - 1)(1/L + (e^{LR} - 1)/L) = e^{LR}
// (e^{LT} - 1)/L, and the long-run share of time spent on work that counts is T / E[X].
double renewal_goodput(double rate, double interval_s, double restart_s) {
  return interval_s * rate / (std::exp(rate * restart_s) * (std::exp(rate * interval_s) - 1));
}

TEST(Campaign, RestartGoodputMatchesRenewalTheory) {
  const double mtbf_s = 3600, interval_s = 3600, relaunch_s = 600;
  const Job job = software_only_job(1024, 1, mtbf_s, relaunch_s);
  CampaignOptions o;
  o.duration_s = 2000 * 3600.0;
  o.checkpoint_interval_s = interval_s;
  o.checkpoint_write_s = 0;
  o.checkpoint_load_s = 0;
  o.seeds = 20;
  const CampaignResult r = simulate_campaign(job, o);
  const double expected = renewal_goodput(1 / mtbf_s, interval_s, relaunch_s);
  EXPECT_NEAR(expected, 0.4926, 5e-4);  // the formula itself, worked by hand
  EXPECT_NEAR(r.goodput.mean, expected, 0.01 * expected) << "mean over 20 runs of 2,000 h";
  EXPECT_LT(std::abs(r.goodput.mean - expected), 3 * r.goodput.mean_ci90 + 1e-3);
  EXPECT_EQ(r.finished_runs, 20);
}

TEST(Campaign, WithoutFailuresCheckpointOverheadIsExact) {
  Job job = software_only_job(64, 8, kNever, 0);
  CampaignOptions o;
  o.target_steps = 100000;  // 100,000 s of compute
  o.checkpoint_interval_s = 1000;
  o.checkpoint_write_s = 50;
  const CampaignResult r = simulate_campaign(job, o);
  // 100 segments of 1,000 s, each but the last followed by a 50 s write (the last segment
  // ends the run before its checkpoint).
  EXPECT_DOUBLE_EQ(r.runs[0].wall_s, 100000 + 99 * 50);
  EXPECT_EQ(r.runs[0].checkpoints, 99);
  EXPECT_NEAR(r.runs[0].goodput, 100000.0 / (100000 + 99 * 50), 1e-12);
  o.fault_tolerance = FaultTolerance::drop_replica;  // nothing fails: no difference
  EXPECT_DOUBLE_EQ(simulate_campaign(job, o).runs[0].wall_s, 100000 + 99 * 50);
  o.checkpoint_async = true;  // only the snapshot stops training
  job.checkpoint.snapshot_s = 2;
  EXPECT_DOUBLE_EQ(simulate_campaign(job, o).runs[0].wall_s, 100000 + 99 * 2);
}

TEST(Campaign, InterruptionsByCauseFollowTheRates) {
  Job job = software_only_job(16384, 1, kNever, 60);
  job.reliability = default_reliability();
  job.reliability.repair_s = 0;
  CampaignOptions o;
  o.checkpoint_interval_s = 3600;
  o.duration_s = 54 * 86400.0;
  o.seeds = 40;
  const CampaignResult r = simulate_campaign(job, o);
  // Failures keep coming during restarts, so every one counts: Poisson with mean rate x
  // duration per class. Llama 3's 54 days on 16,384 GPUs: 268, 46, 7, 35 and 63.
  const std::array<double, kComponents> expected{268, 46, 7, 35, 63};
  for (int i = 0; i < kComponents; ++i) {
    double sum = 0;
    for (const RunResult& run : r.runs) sum += run.interruptions[static_cast<size_t>(i)];
    const double mean = sum / 40, e = expected[static_cast<size_t>(i)];
    EXPECT_NEAR(mean, e, 4 * std::sqrt(e / 40)) << to_string(static_cast<Component>(i));
  }
}

TEST(Campaign, WallTimeIsAccountedFor) {
  Job job = software_only_job(16384, 64, kNever, 60);
  job.reliability = default_reliability();
  job.reliability.straggler_probability = 1e-4;
  job.times = {10, 10.2, 11, 14};
  job.checkpoint = {1e12, 30, 60, 1};
  for (FaultTolerance f : {FaultTolerance::restart, FaultTolerance::drop_replica}) {
    CampaignOptions o;
    o.fault_tolerance = f;
    o.duration_s = 30 * 86400.0;
    o.spares = 2;
    const RunResult run = run_campaign(job, o, 7, false);
    double sum = run.useful_s + run.checkpoint_s + run.straggler_s;
    for (double lost : run.lost_s) sum += lost;
    EXPECT_NEAR(sum, run.wall_s, 1e-6 * run.wall_s) << to_string(f);
    EXPECT_GT(run.straggler_s, 0);
  }
}

TEST(Campaign, MonteCarloBandsShrinkAsOneOverSqrtK) {
  const Job job = software_only_job(1024, 1, 3600, 600);
  CampaignOptions o;
  o.duration_s = 100 * 3600.0;
  o.checkpoint_interval_s = 3600;
  o.checkpoint_write_s = 0;
  o.checkpoint_load_s = 0;
  o.seeds = 25;
  const CampaignResult few = simulate_campaign(job, o);
  o.seeds = 400;
  o.seed = 1000;
  const CampaignResult many = simulate_campaign(job, o);
  // 16 times the runs: a band a quarter as wide (the spread of one run does not change).
  const double ratio = few.goodput.mean_ci90 / many.goodput.mean_ci90;
  EXPECT_GT(ratio, 3.0);
  EXPECT_LT(ratio, 5.3);
  EXPECT_GT(few.goodput.p90 - few.goodput.p10, 0.5 * (many.goodput.p90 - many.goodput.p10));
  EXPECT_LT(few.goodput.p90 - few.goodput.p10, 2.0 * (many.goodput.p90 - many.goodput.p10));
}

TEST(Campaign, SameSeedSameRun) {
  Job job = software_only_job(16384, 16, kNever, 60);
  job.reliability = default_reliability();
  job.checkpoint = {1e12, 30, 60, 1};
  CampaignOptions o;
  o.duration_s = 10 * 86400.0;
  o.fault_tolerance = FaultTolerance::drop_replica;
  const RunResult a = run_campaign(job, o, 3, true), b = run_campaign(job, o, 3, true);
  EXPECT_EQ(a.wall_s, b.wall_s);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.interruptions, b.interruptions);
  EXPECT_NE(a.steps, run_campaign(job, o, 4, false).steps);
}

// 100,352 H100s (784 replicas of TP 8 x PP 16) at the default fleet rates: the job fails
// every half hour or so, and a restart (detection, relaunch, 100k ranks' communicators, the
// checkpoint's load, work since the checkpoint) costs more than a dropped replica's pause.
TEST(Campaign, DropReplicaBeatsRestartAt100kGpus) {
  Job job;
  job.gpus = 100352;
  job.nodes = job.gpus / 8;
  job.gpus_per_node = 8;
  job.replicas = 784;
  job.samples_per_step = 1568;
  job.times = {10, 10, 10 * 784.0 / 783, 10};
  job.reliability = default_reliability();
  job.checkpoint = {1.4e12, 1.4e12 / 2e12, 1.4e12 * 784 / 2e12, 1};
  CampaignOptions o;
  o.duration_s = 30 * 86400.0;
  o.spares = 16;
  o.seeds = 4;
  const CampaignResult restart = simulate_campaign(job, o);
  o.fault_tolerance = FaultTolerance::drop_replica;
  const CampaignResult drop = simulate_campaign(job, o);
  std::printf("100,352 GPUs, 30 days: goodput restart %.3f, drop-replica %.3f\n", restart.goodput.mean,
              drop.goodput.mean);
  EXPECT_GT(drop.goodput.mean, restart.goodput.mean + 0.1);
  EXPECT_DOUBLE_EQ(drop.restart_goodput.mean, restart.goodput.mean);  // the comparison a drop-replica run carries
  EXPECT_DOUBLE_EQ(drop.restart_goodput.p90, restart.goodput.p90);
  // Drop-replica's own loss: each failure stops everyone for the detection and two rebuilds
  // of the data-parallel groups (leaving, rejoining); pauses that overlap merge, and the
  // share of time a Poisson stream (rate L) of pauses of length D covers is 1 - e^{-LD}. In
  // the rest, each failure loses half a step, and the replica's share of throughput while it
  // is out (detection, a spare's swap, relaunch, its own set-up).
  const Reliability& r = job.reliability;
  const double rate = job_failure_rate_per_s(r, job.gpus, job.nodes);
  const double pause_s = r.detection_s + 2 * r.comm_setup_s_per_rank * job.replicas;
  const double paused = 1 - std::exp(-rate * pause_s);
  const double out_s = r.spare_swap_s + r.detection_s + r.relaunch_s + r.comm_setup_s_per_rank * 128;
  const double checkpoint_share = drop.runs[0].checkpoint_s / drop.runs[0].wall_s;
  const double expected =
      (1 - paused) * (1 - rate * 0.5 * job.times.healthy_s - rate * out_s / job.replicas) - checkpoint_share;
  EXPECT_NEAR(drop.goodput.mean, expected, 0.02);
}

}  // namespace
}  // namespace hetflow::campaign
