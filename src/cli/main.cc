// The tandem command: parses flags with CLI11 and turns every error into one clear message and a
// non-zero exit (user errors: what to fix; internal errors: a bug to report).
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "commands.h"
#include "tandem/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem: distributed training with computation and communication in one program"};
  app.require_subcommand(1);
  tandem::cli::add_info(app);
  tandem::cli::add_train(app);
  tandem::cli::add_plan(app);
  tandem::cli::add_eval(app);
  tandem::cli::add_sample(app);
  tandem::cli::add_tune(app);
  tandem::cli::add_emit(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tandem::UserError& e) {
    fmt::print(stderr, "tandem: error: {}\n", e.what());
    return 1;
  } catch (const tandem::InternalError& e) {
    fmt::print(stderr, "tandem: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "tandem: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
