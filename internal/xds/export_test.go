package xds

// Encodes is how many resources this process has encoded for xDS
// (each once per version, whichever streams and principals it reaches).
func Encodes() int64 { return encodes.Load() }
