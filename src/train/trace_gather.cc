// The MPI ranks' trace events sent to rank 0 and re-recorded there on its clock.
#include "trace_gather.h"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "tandem/core/tensor.h"

namespace tandem::train::detail {

// Messages carry bytes in a 16-bit tensor with a 16-byte header: the length and the origin.
void gather_trace(comm::Communicator& world, io::TraceRecorder& trace) {
  constexpr int kTraceTag = 30001;
  const double origin_ns = static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(trace.origin().time_since_epoch())
          .count());
  if (world.rank() != 0) {
    const std::string text = trace.json();
    Tensor header = Tensor::zeros(DType::BF16, Shape{8});
    const uint64_t n = text.size();
    std::memcpy(header.data(), &n, 8);
    std::memcpy(static_cast<char*>(header.data()) + 8, &origin_ns, 8);
    world.send(header, 0, kTraceTag);
    Tensor body = Tensor::zeros(DType::BF16, Shape{static_cast<int64_t>((n + 1) / 2)});
    std::memcpy(body.data(), text.data(), n);
    world.send(body, 0, kTraceTag);
    return;
  }
  for (int r = 1; r < world.size(); ++r) {
    Tensor header = Tensor::zeros(DType::BF16, Shape{8});
    world.recv(header, r, kTraceTag);
    uint64_t n = 0;
    double their_origin_ns = 0;
    std::memcpy(&n, header.data(), 8);
    std::memcpy(&their_origin_ns, static_cast<const char*>(header.data()) + 8, 8);
    Tensor body = Tensor::zeros(DType::BF16, Shape{static_cast<int64_t>((n + 1) / 2)});
    world.recv(body, r, kTraceTag);
    const auto j = nlohmann::json::parse(std::string(static_cast<const char*>(body.data()), n));
    const double shift_us = (their_origin_ns - origin_ns) / 1e3;
    for (const auto& e : j.at("traceEvents"))
      if (e.value("ph", "") == "X")
        trace.record_us(e.at("pid").get<int>(), e.value("cat", "compute"),
                        e.at("name").get<std::string>(), e.at("ts").get<double>() + shift_us,
                        e.at("dur").get<double>());
  }
}

}  // namespace tandem::train::detail
