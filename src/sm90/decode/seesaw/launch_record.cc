// The record of which seesaw kernel the last launch on a host thread ran (launch.h).
#include "sm90/decode/seesaw/launch.h"

namespace mla::sm90::seesaw {
namespace {
thread_local SeesawLaunch last_launch;
}  // namespace

SeesawLaunch last_seesaw_launch() { return last_launch; }
void note_seesaw_launch(SeesawLaunch launch) { last_launch = launch; }

}  // namespace mla::sm90::seesaw
