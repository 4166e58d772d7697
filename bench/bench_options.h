// ember-bench's flags, declared once each (common/option_registry.h) over each
// subcommand's options struct: the kinds of declaration the subcommands share.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ember/common/option_registry.h"

namespace ember::bench {

// A flag bound to a field of a subcommand's options, its default shown in --help.
template <class Opts, class T>
OptionDecl<Opts> bench_flag(const char* name, T Opts::*member, const char* help) {
  return field_option<Opts>(name, member, help, kBenchProgram);
}

// A flag that takes several values (--dims 16 64), its default shown in --help. The
// registry's field_option binds one value, hence a declaration of its own.
template <class Opts, class T>
OptionDecl<Opts> list_flag(const char* name, std::vector<T> Opts::*member, const char* help) {
  OptionDecl<Opts> d;
  d.flag = name;
  d.help = help;
  d.programs = kBenchProgram;
  d.kind = OptionKind::kText;
  d.add = [member, flag = d.flag, help = d.help](CLI::App& app, Opts& o) {
    return app.add_option(flag, o.*member, help)->capture_default_str();
  };
  d.text = [member](const Opts& o) {
    std::string s;
    const char* sep = "";
    for (const T& v : o.*member) s += std::exchange(sep, ",") + fmt::format("{}", v);
    return s;
  };
  d.value = d.text;
  return d;
}

// The same list also split at commas (--dims 16,64 as --dims 16 64).
template <class Opts>
OptionDecl<Opts> comma_separated(OptionDecl<Opts> d) {
  d.add = [add = std::move(d.add)](CLI::App& app, Opts& o) { return add(app, o)->delimiter(','); };
  return d;
}

}  // namespace ember::bench
