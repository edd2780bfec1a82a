package audit

import "syscall"

// readOnlyMount reports whether path lies on a file system mounted
// read-only.
func readOnlyMount(path string) (bool, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return false, err
	}
	const stRdonly = 0x1 // ST_RDONLY in statfs(2)'s f_flags
	return st.Flags&stRdonly != 0, nil
}
