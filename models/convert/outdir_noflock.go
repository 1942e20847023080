//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package convert

import (
	"errors"
	"os"
)

// tryLock reports that there is no flock here: builds go unlocked, and their
// directories are judged by their age (see sweepStaleBuilds).
func tryLock(*os.File) (bool, error) { return false, errors.New("no flock on this system") }
