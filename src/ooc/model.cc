// The performance model: a step simulated on compute, swap-out and swap-in streams.
#include "tandem/ooc/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tandem/io/trace.h"

namespace tandem::ooc {

Prediction simulate(const MemorySchedule& s, const Profile& p, bool want_timeline) {
  const auto& ops = s.ops();
  const auto& acts = s.actions();
  const auto& tr = s.transfers();
  Prediction out;
  out.peak_bytes = s.peak_bytes();
  out.swapped_bytes = s.swapped_bytes();
  std::vector<double> done(tr.size(), 0.0);
  double t_compute = 0, t_write = 0, t_read = 0;
  auto span = [&](const char* stream, std::string name, double b, double e) {
    if (want_timeline) out.timeline.push_back(TimelineSpan{stream, std::move(name), b, e});
  };
  auto label = [&](const Transfer& t) {
    return fmt::format("m{}.{}", t.micro, s.chain().unit_name(t.unit));
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const UnitOp& op = ops[i];
    const OpActions& a = acts[i];
    double start = t_compute;
    for (int w : a.finish_writes) start = std::max(start, done[static_cast<size_t>(w)]);
    for (int r : a.issue_reads) {
      const Transfer& t = tr[static_cast<size_t>(r)];
      // Issuing waits (on the compute thread) for the write of the same data.
      if (t.after_write >= 0) start = std::max(start, done[static_cast<size_t>(t.after_write)]);
      const double b = std::max(start, t_read);
      done[static_cast<size_t>(r)] = t_read = b + static_cast<double>(t.bytes) / p.read_bytes_per_s;
      span("swap-in", label(t), b, t_read);
    }
    for (int r : a.finish_reads) start = std::max(start, done[static_cast<size_t>(r)]);
    out.stall_s += start - t_compute;
    double d = 0;
    for (int b : a.recompute) d += p.recompute(b);
    out.recompute_s += d;
    if (d > 0)
      span("compute",
           fmt::format("recompute m{} {}..{}", op.micro, s.chain().unit_name(a.recompute.front()),
                       s.chain().unit_name(a.recompute.back())),
           start, start + d);
    const size_t j = static_cast<size_t>(op.unit);
    const double c = op.forward ? p.forward_s[j] : p.backward_s[j];
    span("compute",
         fmt::format("{} m{} {}", op.forward ? "forward" : "backward", op.micro,
                     s.chain().unit_name(op.unit)),
         start + d, start + d + c);
    t_compute = start + d + c;
    out.compute_s += d + c;
    for (int w : a.issue_writes) {
      const Transfer& t = tr[static_cast<size_t>(w)];
      const double b = std::max(t_compute, t_write);
      done[static_cast<size_t>(w)] = t_write =
          b + static_cast<double>(t.bytes) / p.write_bytes_per_s;
      span("swap-out", label(t), b, t_write);
    }
  }
  out.step_s = t_compute;
  for (double d : done) out.step_s = std::max(out.step_s, d);
  return out;
}

std::string chrome_trace(const Prediction& p) {
  io::TraceRecorder trace;
  // Whole nanoseconds, as the recorder keeps measured spans.
  const auto us = [](double seconds) { return std::round(seconds * 1e9) / 1e3; };
  for (const TimelineSpan& s : p.timeline)
    trace.record_us(0, s.stream, s.name, us(s.begin_s), us(s.end_s - s.begin_s));
  return trace.json();
}

}  // namespace tandem::ooc
