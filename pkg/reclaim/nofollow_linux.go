package reclaim

import "golang.org/x/sys/unix"

// noFollow makes opening a planted symlink in a lease directory fail
// instead of reading (or later removing) whatever it points to.
const noFollow = unix.O_NOFOLLOW
