// Command hello prints hello: the program proctest's test builds.
package main

import "fmt"

func main() { fmt.Println("hello") }
