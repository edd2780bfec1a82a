package ownership

// ShardOfFast exposes shardOf to the tests.
var ShardOfFast = shardOf
