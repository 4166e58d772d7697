#include "ember/ps/row_options.h"

namespace ember::ps {

namespace {

using Decl = OptionDecl<RowSettings>;

template <class T>
Decl option(const char* flag, T RowSettings::*member, const char* help) {
  return field_option<RowSettings>(flag, member, help, kWorkerProgram | kPsProgram);
}

}  // namespace

const std::vector<OptionDecl<RowSettings>>& row_options() {
  // The help texts speak of both daemons: each shows them in its --help.
  static const std::vector<Decl> decls = {
      option("--dim", &RowSettings::dim, "embedding dimension (ember-worker: for --reference; a job's is the PS shards')"),
      option("--optimizer", &RowSettings::optimizer,
             "sparse optimizer: sgd, adagrad, rowwise-adagrad, adam (ember-worker: for --reference; a job's is the PS shards')"),
      option("--lr", &RowSettings::lr, "sparse learning rate (ember-worker: for --reference; a job's is the PS shards')"),
  };  // immutable after its first use
  return decls;
}

}  // namespace ember::ps
