// Command-line parsing shared by every Ember program (header only:
// CLI11 is, and only the tools that parse a command line include this).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

namespace ember {

// Call before adding options. Adds --config (TOML/INI; a key that names no option is an
// error, not ignored), and lets an option given twice take its last value, so that a
// launcher's defaults can be overridden by the arguments a user passes after them.
inline void add_config_option(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_config("--config", "", "read options from this TOML/INI file");
  app.allow_config_extras(CLI::config_extras_mode::error);
}

// The status of a refused command line: 2, as for any setting refused (ConfigError,
// error.h), so that a launcher tells it from a failure a restart may mend.
inline constexpr int kCommandLineRefused = 2;

// Parses argv. Returns -1 to go on, else the status to exit with: 0 after --help, or
// kCommandLineRefused after one line naming the program, the flag or the config file.
inline int parse_command_line(CLI::App& app, int argc, char** argv, const char* program) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ConfigError& e) {
    const CLI::Option* config = app.get_config_ptr();
    const std::string file = config != nullptr && config->count() > 0 ? config->as<std::string>() : "";
    std::string what = e.what();
    const std::string extra = "INI was not able to parse ";  // CLI11's words for a key no option has
    if (what.rfind(extra, 0) == 0) what = "'" + what.substr(extra.size()) + "' is not an option (see --help)";
    std::fprintf(stderr, "%s: error: config file %s: %s\n", program, file.c_str(), what.c_str());
    return kCommandLineRefused;
  } catch (const CLI::FileError& e) {  // the config file cannot be read
    std::fprintf(stderr, "%s: error: --config: %s\n", program, e.what());
    return kCommandLineRefused;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "%s: error: %s (see --help)\n", program, e.what());
    return kCommandLineRefused;
  }
  return -1;
}

}  // namespace ember
