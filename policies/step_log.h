// The step log: every engine step as one JSON line (docs/serving.md). A live server writes it
// as its steps happen (`duet serve --step-log`, `duet worker --step-log`, backend/engine/
// step_log.h) and the simulator as it prices them (`duet simulate --step-log`): the step's
// shape and its forward pass's time as "seconds" (a line `duet calibrate --measurements`
// reads), the instance ("instance"), when the iteration that ran it began on the run's clock
// ("start_s"), how long that whole iteration took ("iteration_s": scheduling, the forward pass,
// sampling and handing the tokens on) and, live, its host time by phase with the step's counts
// ("host": models/host_time.h) and the forward pass's CPU time ("forward_cpu_s"). `duet validate`
// reads both worlds' logs to say where the simulator's error comes from; `duet calibrate
// --host-steps` fits host time to a live one.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "models/host_time.h"
#include "models/step_profile.h"
#include "policies/request.h"

namespace duet::policies {

// One line of a step log.
struct StepLogLine {
  InstanceId instance = 0;
  Seconds start_s = 0;
  Seconds iteration_s = 0;
  models::StepTiming step;  // the shape and its forward pass's time
  // Its host time outside the forward pass by phase, and its counts (none in logs written
  // before the phases were measured).
  std::optional<models::HostStep> host;
  // Asynchronous steps ("async": true): the forward pass ran on the step thread while the
  // engine planned, applied and streamed, so it and the phases overlap the iteration instead
  // of adding up to at most it.
  bool async = false;
  // An iteration that began when a message woke the idle engine ("woke_s"): the time from that
  // message's arrival in the inbox to the iteration's start, the engine's wake-up. Requests
  // handed over meanwhile join its step. Absent in live logs written before it was measured;
  // the simulator writes the wake-up it priced (0 where it prices none).
  std::optional<Seconds> woke_s;
  // The CPU time that the thread which ran the forward pass spent in it ("forward_cpu_s"; live
  // logs only): with a pass on one thread, the part of "seconds" the thread was on a core; the
  // rest it was preempted by other threads, or, in a virtual machine whose kernel accounts steal,
  // its core was taken by the hypervisor. Of a pass on several threads or on a GPU, the calling
  // thread's share only. Absent in logs written before it was measured.
  std::optional<Seconds> forward_cpu_s;
  // The iteration's host time outside its forward pass (a line with `host`): the iteration
  // less the pass, or, asynchronous, the phases' sum (the pass overlapped the iteration).
  Seconds HostSeconds() const;
  // Its wake-up where a new request woke the engine: a woken iteration whose step prefilled (a
  // PD decode engine, which KV arriving wakes, decodes only). The wake-up that decides how many
  // of a burst's requests the step takes, which the simulator prices (a profile's host fit
  // "wake_s": `duet calibrate --host-steps`, validate's handing-over simulation).
  std::optional<Seconds> RequestWakeS() const;
};
// The line as the log holds it (its newline included).
std::string FormatStepLogLine(const StepLogLine& line);
// Calls `each` for every line of a step log, in order (blank lines skipped); stops at the first
// bad line with an error naming `where`:line and the field. One step's "seconds" is one
// number; unless the line is "async", it and the "host" phases add up to at most "iteration_s".
Status ReadStepLog(std::string_view text, const std::string& where,
                   const std::function<void(const StepLogLine&)>& each);

}  // namespace duet::policies
