// One declaration per option: its flag (the one name in every program), help, the
// programs that take it, whether the workers of a job must agree on it, whether the
// launchers pass it as a job setting, and how it binds to a configuration field. The
// command lines (add_options), the workers' join check (agreed values) and the
// launchers' list (ember-worker --options-json) all come from these declarations.
// Header only: CLI11 is, and only the modules that build a command line include this.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ember {

// The programs that take an option, a bit each.
enum Program : unsigned {
  kWorkerProgram = 1u,  // ember-worker (a training job)
  kSimProgram = 2u,     // ember-sim
  kShapeProgram = 4u,   // ember-plan, ember-bench sched: the job's shape only
  kPsProgram = 8u,      // ember-ps (a parameter-server shard)
  kDataProgram = 16u,   // ember-data
  kBenchProgram = 32u,  // ember-bench (each subcommand's own flags)
};

// What a launcher knows of the value: a switch, a whole number, a number, or text.
enum class OptionKind { kFlag, kInteger, kNumber, kText };

inline const char* kind_name(OptionKind k) {
  switch (k) {
    case OptionKind::kFlag:
      return "flag";
    case OptionKind::kInteger:
      return "integer";
    case OptionKind::kNumber:
      return "number";
    case OptionKind::kText:
      return "text";
  }
  return "text";
}

template <class Cfg>
struct OptionDecl {
  std::string flag;  // "--lookahead"
  std::string help;
  unsigned programs = 0;  // Program bits
  OptionKind kind = OptionKind::kText;
  bool agreed = false;   // the workers of one job must agree on it (the join check)
  bool setting = false;  // the launchers take it for every worker; summary.json records it
  // Registers the flag on `app`, bound to cfg's field, its current value the default.
  std::function<CLI::Option*(CLI::App&, Cfg&)> add;
  // The value as written on a command line, and as the workers compare it (the same
  // unless compared_as says otherwise).
  std::function<std::string(const Cfg&)> text;
  std::function<std::string(const Cfg&)> value;

  OptionDecl must_agree() const {
    OptionDecl d = *this;
    d.agreed = true;
    return d;
  }
  OptionDecl job_setting() const {
    OptionDecl d = *this;
    d.setting = true;
    return d;
  }
  // The value compared when it is not the field as written (a resolved default, a file's
  // contents rather than its path).
  OptionDecl compared_as(std::function<std::string(const Cfg&)> v) const {
    OptionDecl d = *this;
    d.value = std::move(v);
    return d;
  }
  // Shown in --help without its default (a 0 that means "not given").
  OptionDecl default_hidden() const {
    OptionDecl d = *this;
    d.add = [add = add](CLI::App& app, Cfg& c) { return add(app, c)->default_str(""); };
    return d;
  }
  // A check on the value given (CLI11's validators: CLI::Range, CLI::IsMember, ...).
  OptionDecl checked(CLI::Validator v) const {
    OptionDecl d = *this;
    d.add = [add = add, v](CLI::App& app, Cfg& c) { return add(app, c)->check(v); };
    return d;
  }
};

inline std::string on_off(bool b) { return b ? "on" : "off"; }

// An option bound to a field of Cfg (or of a base of Cfg): a switch for bool, a number
// or text otherwise, shown with its default in --help.
template <class Cfg, class Base, class T>
OptionDecl<Cfg> field_option(std::string flag, T Base::*member, std::string help, unsigned programs) {
  static_assert(std::is_base_of_v<Base, Cfg>, "the field must belong to the configuration");
  OptionDecl<Cfg> d;
  d.flag = std::move(flag);
  d.help = std::move(help);
  d.programs = programs;
  if constexpr (std::is_same_v<T, bool>) {
    d.kind = OptionKind::kFlag;
    d.add = [member, flag = d.flag, help = d.help](CLI::App& app, Cfg& c) { return app.add_flag(flag, c.*member, help); };
    d.text = [member](const Cfg& c) { return on_off(c.*member); };
  } else {
    if constexpr (std::is_integral_v<T>)
      d.kind = OptionKind::kInteger;
    else if constexpr (std::is_floating_point_v<T>)
      d.kind = OptionKind::kNumber;
    else
      d.kind = OptionKind::kText;
    d.add = [member, flag = d.flag, help = d.help](CLI::App& app, Cfg& c) {
      return app.add_option(flag, c.*member, help)->capture_default_str();
    };
    d.text = [member](const Cfg& c) {
      if constexpr (std::is_arithmetic_v<T>)
        return fmt::format("{}", c.*member);
      else
        return std::string(c.*member);
    };
  }
  d.value = d.text;
  return d;
}

// An option of milliseconds bound to a std::chrono::milliseconds field.
template <class Cfg, class Base>
OptionDecl<Cfg> millis_option(std::string flag, std::chrono::milliseconds Base::*member, std::string help, unsigned programs) {
  OptionDecl<Cfg> d;
  d.flag = std::move(flag);
  d.help = std::move(help);
  d.programs = programs;
  d.kind = OptionKind::kInteger;
  d.add = [member, flag = d.flag, help = d.help](CLI::App& app, Cfg& c) {
    return app
        .add_option_function<long long>(
            flag, [member, &c](long long ms) { c.*member = std::chrono::milliseconds(ms); }, help)
        ->default_str(std::to_string((c.*member).count()));
  };
  d.text = [member](const Cfg& c) { return std::to_string((c.*member).count()); };
  d.value = d.text;
  return d;
}

// A declaration of a part of a configuration (a base, or a member struct) as one of the
// whole: `part(cfg)` gives the part, for a Cfg& and a const Cfg& alike.
template <class Cfg, class Part, class GetPart>
OptionDecl<Cfg> rebind_option(const OptionDecl<Part>& p, GetPart part) {
  OptionDecl<Cfg> d;
  d.flag = p.flag;
  d.help = p.help;
  d.programs = p.programs;
  d.kind = p.kind;
  d.agreed = p.agreed;
  d.setting = p.setting;
  d.add = [add = p.add, part](CLI::App& app, Cfg& c) { return add(app, part(c)); };
  d.text = [text = p.text, part](const Cfg& c) { return text(part(c)); };
  d.value = [value = p.value, part](const Cfg& c) { return value(part(c)); };
  return d;
}

// An option bound to a field of a part of Cfg (a member struct): field_option on the
// part, rebound through `part`.
template <class Cfg, class Part, class T, class GetPart>
OptionDecl<Cfg> member_option(std::string flag, T Part::*member, std::string help, unsigned programs, GetPart part) {
  return rebind_option<Cfg>(field_option<Part>(std::move(flag), member, std::move(help), programs), part);
}

// The declarations of a base configuration, for a configuration that extends it (the
// worker's TrainConfig takes the scheduler's options so).
template <class Cfg, class Base>
std::vector<OptionDecl<Cfg>> lift_options(const std::vector<OptionDecl<Base>>& base) {
  static_assert(std::is_base_of_v<Base, Cfg>);
  std::vector<OptionDecl<Cfg>> out;
  for (const OptionDecl<Base>& b : base)
    out.push_back(rebind_option<Cfg>(
        b, [](auto& c) -> auto& { return c; }));
  return out;
}

// Registers on `app` every declaration `program` takes, bound to `cfg`.
template <class Cfg>
void add_options(CLI::App& app, const std::vector<OptionDecl<Cfg>>& decls, Cfg& cfg, Program program) {
  for (const OptionDecl<Cfg>& d : decls) {
    if ((d.programs & program) != 0) d.add(app, cfg);
  }
}

// A flag an earlier release spelt otherwise: given, it fails naming the new one (hidden
// from --help).
inline void add_renamed_flag(CLI::App& app, const std::string& old_name, const std::string& new_name, bool takes_value) {
  const std::string message = old_name + " is now called " + new_name;
  if (takes_value) {
    app.add_option_function<std::string>(old_name, [message](const std::string&) { throw CLI::ValidationError(message); })->group("");
  } else {
    app.add_flag_callback(old_name, [message] { throw CLI::ValidationError(message); })->group("");
  }
}

}  // namespace ember
