package tokenizer_test

import (
	"fmt"

	"github.com/conveyor-llm/conveyor/tokenizer"
)

func Example() {
	tk, err := tokenizer.Load("testdata")
	if err != nil {
		fmt.Println(err)
		return
	}
	ids, _ := tk.Encode("Hello 😀", true)
	bos, _ := tk.BOS()
	fmt.Println(ids[0] == bos, tk.Decode(ids, true))

	// The emoji is four byte tokens: the stream returns it whole, at its last byte.
	stream := tk.NewStream(true)
	for _, id := range ids {
		if piece := stream.Add(id); piece != "" {
			fmt.Printf("%q\n", piece)
		}
	}
	fmt.Printf("%q\n", stream.Flush())

	prompt, _ := tk.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: "Hi"}}, true)
	fmt.Printf("%q\n", prompt)
	// Output:
	// true Hello 😀
	// "H"
	// "ell"
	// "o"
	// " "
	// "😀"
	// ""
	// "<s><|user|>\nHi</s>\n<|assistant|>\n"
}
