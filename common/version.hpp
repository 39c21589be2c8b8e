// The stepcast version and the git commit it was built from (written at build time).
#pragma once

namespace stepcast {
const char* stepcast_version();
const char* stepcast_git_commit();  // short hash, "-dirty" when built from uncommitted changes
}  // namespace stepcast
