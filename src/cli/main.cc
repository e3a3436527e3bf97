// The tandem command: parses flags with CLI11 and turns every error into one clear message and a
// non-zero exit (user errors: what to fix; internal errors: a bug to report). A rank of an MPI
// job that fails ends the whole job, so that no peer waits for it forever.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "choices.h"
#include "commands.h"
#include "tandem/comm/mpi.h"
#include "tandem/core/error.h"

namespace {

// Prints `message` ("tandem: error: ...") and returns `code`. In a job of two or more processes
// the message names the rank (unless it already does), and once MPI is running the job is
// aborted: this rank would otherwise hang in MPI_Finalize while its peers wait for it in a
// collective. (Before MPI_Init, a process that exits with an error ends the job: mpirun sees to
// that.)
// A message past kMaxMessage bytes (a name or a value no check abbreviated) is cut in the middle:
// a message is read, not scrolled through.
int fail(const std::string& prefix, const std::string& message, int code) {
  constexpr size_t kMaxMessage = 4096;
  const std::string what =
      message.size() <= kMaxMessage
          ? message
          : fmt::format("{} ... [{} bytes left out] ... {}", message.substr(0, kMaxMessage - 1024),
                        message.size() - kMaxMessage, message.substr(message.size() - 1024));
  const auto job = tandem::comm::running_mpi_job();
  const auto place = job ? job : tandem::comm::launched_mpi_job();
  std::string rank;
  if (place) {
    const std::string tag = fmt::format("rank {} of {}", place->rank, place->size);
    if (what.find(tag) == std::string::npos) rank = tag + ": ";
  }
  fmt::print(stderr, "{}{}{}\n", prefix, rank, what);
  if (!job) return code;
  std::fflush(stdout);
  std::fflush(stderr);
  tandem::comm::abort_mpi_job(code);
}

// " train" when the subcommand whose flags were being parsed is train; "" for the command itself.
std::string help_target(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) return " " + sub->get_name();
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  // Past a file-size limit, a write fails with EFBIG and the user reads which file, as on a full
  // disk, rather than the process being killed without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"tandem: distributed training with computation and communication in one program"};
  app.require_subcommand(1);
  tandem::cli::add_info(app);
  tandem::cli::add_tokenize(app);
  tandem::cli::add_train(app);
  tandem::cli::add_plan(app);
  tandem::cli::add_eval(app);
  tandem::cli::add_sample(app);
  tandem::cli::add_export(app);
  tandem::cli::add_tune(app, {argv + 1, argv + argc});
  tandem::cli::add_emit(app);
  tandem::cli::check_numbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and succeed; a flag CLI11 cannot parse is the user's error, in
    // tandem's own form.
    if (e.get_exit_code() == 0) return app.exit(e);
    if (app.get_subcommands().empty() && argc > 1 && argv[1][0] != '-') {
      std::vector<std::string> names;
      for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
      return fail("tandem: error: ",
                  fmt::format("'{}' is not a tandem command; the commands are {}", argv[1],
                              fmt::join(names, ", ")),
                  1);
    }
    return fail("tandem: error: ",
                fmt::format("{} (tandem{} --help lists the flags)", e.what(), help_target(app)), 1);
  } catch (const tandem::cli::StoppedBySignal& s) {
    return 128 + s.signal;  // every rank stopped after the same step: none waits for another
  } catch (const tandem::comm::StopWaitError& e) {
    // A wait for a peer that never came, given up after the signal: the run did not finish, as
    // one the signal ended.
    return fail("tandem: error: ", e.what(), 128 + e.signal());
  } catch (const tandem::comm::CollectiveError& e) {
    // Every rank raised it at the same point: none waits for another, so each exits normally
    // (through MPI_Finalize) and only rank 0 says why.
    const auto job = tandem::comm::running_mpi_job();
    if (!job || job->rank == 0) fmt::print(stderr, "tandem: error: {}\n", e.what());
    return 1;
  } catch (const tandem::UserError& e) {
    return fail("tandem: error: ", e.what(), 1);
  } catch (const tandem::InternalError& e) {
    return fail("tandem: ", e.what(), 2);
  } catch (const std::exception& e) {
    return fail("tandem: error: ", e.what(), 1);
  }
  return 0;
}
