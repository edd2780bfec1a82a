package webui

// EventStreams is how many live-update event streams are open.
func EventStreams() int64 { return eventStreams.Load() }
