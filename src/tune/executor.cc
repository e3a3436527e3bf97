// The tuner's executors: each makes exec::Runners of one kind.
#include "tandem/tune/executor.h"

#include <utility>

namespace tandem::tune {
namespace {

class KindExecutor final : public Executor {
 public:
  KindExecutor(exec::RunnerKind kind, exec::JitOptions options)
      : kind_(kind), options_(std::move(options)) {}
  std::string name() const override { return std::string(exec::runner_kind_name(kind_)); }
  std::unique_ptr<exec::Runner> prepare(const schedule::Plan& plan, comm::Communicator& comm,
                                        const dsl::SymbolMap& symbols,
                                        size_t chunk_bytes) override {
    exec::RunnerOptions o;
    o.jit = options_;
    o.chunk_bytes = chunk_bytes;
    return exec::make_runner(kind_, plan, comm, symbols, o);
  }

 private:
  exec::RunnerKind kind_;
  exec::JitOptions options_;
};

}  // namespace

std::unique_ptr<Executor> executor_of(exec::RunnerKind kind, const exec::JitOptions& options) {
  return std::make_unique<KindExecutor>(kind, options);
}

std::unique_ptr<Executor> executor_by_name(std::string_view name) {
  return executor_of(exec::runner_kind_from_name(name, "--executor"));
}

}  // namespace tandem::tune
