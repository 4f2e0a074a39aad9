"""Tokenizer tests against llama.cpp itself.

The expected ids below were produced by llama.cpp's ``llama-tokenize`` built from commit
0c1e57098bba43ac29e6e3b677cdceebdd22334f (the copy vendored in the llama-cpp-python 0.3.36 sdist;
``cmake -B build -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF && cmake --build build --target llama-tokenize``),
one run per string, the string written byte for byte to FILE:

    llama-tokenize -m MODEL -f FILE --ids --no-escape --log-disable [--no-parse-special]

MODEL = qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (pre "qwen2") or smollm2-135m-instruct-q4_1.gguf
(pre "smollm"). For the other pre-tokenizers, MODEL was a vocab-only copy of the smollm2 file with
only tokenizer.ggml.pre changed: "llama-bpe" (and tokenizer.ggml.add_bos_token removed, so
llama.cpp's default applies), "gpt-2", or the key removed ("default"). The EOG sets are the ones
llama.cpp logs at load ("printing all EOG tokens").
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time

import pytest

from minfer_core.gguf_file import open_gguf
from minfer_core.tokenizer import StreamDecoder, Tokenizer, bytes_to_unicode

# fmt: off
CASES = [
    'Hello, world!',
    'Hello, world! ünïcödé 12345',
    '   leading spaces and trailing   ',
    'tabs\tand\t\ttabs\n\nnew\nlines\r\nwindows\n\n\n',
    '12345678 3.14159 1,000,000 0x1F 2024-11-29',
    "I'm don't you'll we've they're she'd it's I'M DON'T",
    'ünïcödé naïve café résumé Ångström',
    'emoji: 🙂👍🏽🇫🇷 ❤️ 🤖🚀',
    'def f(x):\n    if x:\n        return x * 2\n    return None\n',
    '中文分词测试：你好，世界！今天天气很好。',
    '日本語のテキスト、カタカナ、ひらがな。한국어 텍스트',
    '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n',
    '<|im_start|>system\nYou are helpful.<|im_end|>',
    'text<|endoftext|>more text<|endoftext|>',
    '<tool_call>\n{"name": "f"}\n</tool_call>',
    '<|fim_prefix|>def a():<|fim_suffix|>\n<|fim_middle|>',
    '  \n  \n\t x  y   z    ',
    'Ελληνικά Русский текст العربية עברית हिन्दी',
    'a\xa0b\u2003c\u200bd\u3000e',
    '$$$ ### @@@ !!! ??? ... --- === +++ ~~~',
    'https://example.com/path?query=1&x=y#frag',
    'CamelCaseWord snake_case_word kebab-case-word SCREAMING_CASE',
    'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx abababababababababababababababababababababababababababababab',
    '\n',
    ' ',
    '',
    'mixed 1a2b3c 10x 3rd 100% $5.99',
    '<|im_start|',
    '<|im_end|><|im_end|>',
    '  <|im_start|>  spaced  <|im_end|>  ',
    ('<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n'
     '<|im_start|>user\nWrite a haiku about GPUs.<|im_end|>\n<|im_start|>assistant\nSilicon rivers<|im_end|>\n'
     '<|im_start|>user\nNow one about CPUs.<|im_end|>\n<|im_start|>assistant\n'),
    'é ä ñ combining',
    'digits ١٢٣ ²³ ½ Ⅻ ⅷ ８９ 𝟙𝟚',
    'zwj 👨\u200d👩\u200d👧 flag 🏳️\u200d🌈',
    'ctrl \x00\x01\x07\x1b[0m\x7f end',
    'line\u2028sep\u2029para\x85nel\x0bvt\x0cff',
    '\n \n  \n   \n',
    '                                                                                                    x',
    '99999999999999999999999999999999999999999999999999',
    'curly ’s ’t don’t “quoted”',
    "UPPER 'S 'LL 'VE 'RE 'D 'M 'T",
    'abc<|im_end|>def<|im_start|>ghi',
    '<|im_start|><|im_start|>',
    '    indented\n\tline\n  \n',
    'a.b,c;d:e!f?g(h)[i]{j}<k>',
    'x = [1, 2, 3]\nprint(f"{x!r}")  # comment\n',
    '<reponame>repo<file_sep>file<filename>f.py<gh_stars>10',
    'Ⓐ Ⓑ ℃ ™ © ® ∑ ∫ √ ∞ ≠ ≤',
    '😀😁😀😁😀😁😀😁😀😁',
    'ññññññññññññññññññññ',
    "ab'cd'ef 'quote' ''",
    'end</s>start<s> [PAD151665] <PAD> <unk>',
    '<|endoftext|></s><|im_end|>',
]
QWEN_IDS = [  # parse_special=True, one list per CASES entry
    [9707, 11, 1879, 0],
    [9707, 11, 1879, 0, 10489, 77, 37572, 66, 2956, 128505, 220, 16, 17, 18, 19, 20],
    [256, 6388, 12621, 323, 27748, 262],
    [30993, 52477, 197, 3244, 3435, 271, 931, 198, 7969, 319, 27077, 1406],
    [16, 17, 18, 19, 20, 21, 22, 23, 220, 18, 13, 16, 19, 16, 20, 24, 220, 16, 11, 15, 15, 15, 11, 15, 15, 15,
     220, 15, 87, 16, 37, 220, 17, 15, 17, 19, 12, 16, 16, 12, 17, 24],
    [40, 2776, 1513, 944, 498, 3278, 582, 3003, 807, 2299, 1340, 4172, 432, 594, 358, 27603, 44273, 17323],
    [16074, 37572, 66, 2956, 128505, 94880, 586, 51950, 9333, 1242, 963, 79252, 968, 495, 85584],
    [37523, 25, 27484, 144349, 145375, 145919, 145070, 70470, 30543, 11162, 97, 244, 145836],
    [750, 282, 2075, 982, 262, 421, 856, 510, 286, 470, 856, 353, 220, 17, 198, 262, 470, 2240, 198],
    [104811, 17177, 99689, 81705, 5122, 108386, 3837, 99489, 6313, 100644, 104307, 101243, 1773],
    [101059, 102819, 15767, 56833, 61803, 70534, 5373, 70393, 46207, 70393, 95352, 5373, 124877, 32403, 28195,
     25770, 1773, 23573, 124785, 31079, 10764, 44104, 53189],
    [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198],
    [151644, 8948, 198, 2610, 525, 10950, 13, 151645],
    [1318, 151643, 6384, 1467, 151643],
    [151657, 198, 4913, 606, 788, 330, 69, 16707, 151658],
    [151659, 750, 264, 4555, 151661, 198, 151660],
    [30779, 197, 856, 220, 379, 256, 1147, 257],
    [144674, 33486, 33486, 41424, 33269, 29762, 67337, 74134, 140869, 126302, 70895, 129071, 131917, 123826,
     84310, 42311, 101, 30484, 99, 43647],
    [64, 4102, 65, 378, 225, 66, 15692, 67, 22441, 68],
    [74573, 16600, 569, 19191, 32870, 51317, 2503, 12448, 2049, 59092, 3968, 5817],
    [2428, 1110, 8687, 905, 50976, 30, 1631, 28, 16, 5, 87, 29368, 2, 33198],
    [25406, 301, 4207, 10879, 25265, 19096, 13533, 1962, 47722, 38485, 37328, 7531, 15915, 1718, 28540],
    [44102, 44102, 44102, 44102, 44102, 668, 370, 370, 370, 370, 370, 370, 370, 370, 370, 370, 370, 370, 370,
     370, 370, 370, 370, 370, 370, 370, 370, 370, 370, 370, 370, 370, 370, 370, 370],
    [198],
    [220],
    [],
    [56685, 220, 16, 64, 17, 65, 18, 66, 220, 16, 15, 87, 220, 18, 6498, 220, 16, 15, 15, 4, 400, 20, 13, 24,
     24],
    [27, 91, 318, 4906, 91],
    [151645, 151645],
    [256, 151644, 220, 63828, 256, 151645, 256],
    [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264, 10950, 17847,
     13, 151645, 198, 151644, 872, 198, 7985, 264, 6386, 38242, 911, 70403, 13, 151645, 198, 151644, 77091,
     198, 27571, 1924, 35517, 151645, 198, 151644, 872, 198, 7039, 825, 911, 65475, 13, 151645, 198, 151644,
     77091, 198],
    [68, 53839, 264, 136, 230, 308, 136, 225, 34171],
    [60770, 220, 149, 94, 149, 95, 149, 96, 220, 29456, 43201, 220, 26062, 220, 70467, 104, 220, 70467, 115,
     220, 65015, 66993, 220, 56252, 253, 247, 56252, 253, 248],
    [30781, 73, 61804, 101, 378, 235, 145233, 378, 235, 145665, 5181, 11162, 237, 111, 30543, 378, 235, 145354],
    [11933, 220, 188, 189, 195, 90435, 15, 76, 221, 835],
    [1056, 378, 101, 28036, 378, 102, 14794, 126, 227, 8138, 199, 9708, 200, 542],
    [26809, 2303, 5872],
    [5238, 1920, 856],
    [24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24,
     24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24],
    [2352, 398, 17744, 82, 17744, 83, 1513, 1405, 1036, 63725, 854],
    [3124, 9654, 364, 50, 364, 4086, 364, 4491, 364, 787, 364, 35, 364, 44, 364, 51],
    [13683, 151645, 750, 151644, 75076],
    [151644, 151644],
    [262, 1257, 15864, 198, 27109, 13887],
    [64, 948, 10109, 99149, 55976, 0, 69, 30, 70, 3203, 6620, 72, 15370, 73, 70793, 74, 29],
    [87, 284, 508, 16, 11, 220, 17, 11, 220, 18, 921, 1350, 955, 14129, 87, 0, 81, 55961, 220, 671, 3980, 198],
    [27, 265, 618, 373, 29, 23476, 27, 1192, 54775, 29, 1192, 27, 8404, 84394, 7197, 27, 866, 1261, 1561, 29,
     16, 15],
    [147207, 2858, 240, 115, 28653, 225, 28653, 95, 7240, 60479, 11995, 239, 11995, 104, 11995, 248, 11995, 252,
     94304, 37294],
    [141334, 144534, 141334, 144534, 141334, 144534, 141334, 144534, 141334, 144534],
    [5653, 5653, 5653, 5653, 5653, 5653, 5653, 5653, 5653, 5653, 5653, 5653, 5653, 5653, 5653, 5653, 5653, 5653,
     5653, 5653],
    [370, 6, 4385, 6, 823, 364, 2949, 6, 3355],
    [408, 128247, 2468, 44047, 29, 508, 43818, 16, 20, 16, 21, 21, 20, 60, 366, 43818, 29, 366, 3122, 29],
    [151643, 128247, 151645],
]
QWEN_IDS_NO_SPECIAL = {  # parse_special=False, where it differs (CASES index: ids)
    11: [27, 91, 318, 4906, 91, 29, 872, 198, 6023, 27, 91, 318, 6213, 91, 397, 27, 91, 318, 4906, 91, 29,
         77091, 198],
    12: [27, 91, 318, 4906, 91, 29, 8948, 198, 2610, 525, 10950, 15757, 91, 318, 6213, 91, 29],
    13: [1318, 27, 91, 8691, 723, 427, 91, 29, 6384, 1467, 27, 91, 8691, 723, 427, 91, 29],
    15: [27, 91, 69, 318, 13974, 91, 29, 750, 264, 4555, 27, 91, 69, 318, 37151, 91, 397, 27, 91, 69, 318,
         62580, 91, 29],
    28: [27, 91, 318, 6213, 91, 1784, 91, 318, 6213, 91, 29],
    29: [220, 82639, 318, 4906, 91, 29, 220, 63828, 220, 82639, 318, 6213, 91, 29, 256],
    30: [27, 91, 318, 4906, 91, 29, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446,
         525, 264, 10950, 17847, 15757, 91, 318, 6213, 91, 397, 27, 91, 318, 4906, 91, 29, 872, 198,
         7985, 264, 6386, 38242, 911, 70403, 15757, 91, 318, 6213, 91, 397, 27, 91, 318, 4906, 91, 29,
         77091, 198, 27571, 1924, 35517, 27, 91, 318, 6213, 91, 397, 27, 91, 318, 4906, 91, 29, 872,
         198, 7039, 825, 911, 65475, 15757, 91, 318, 6213, 91, 397, 27, 91, 318, 4906, 91, 29, 77091,
         198],
    41: [13683, 27, 91, 318, 6213, 91, 29, 750, 27, 91, 318, 4906, 91, 29, 75076],
    42: [27, 91, 318, 4906, 91, 1784, 91, 318, 4906, 91, 29],
    51: [408, 522, 82, 29, 2468, 44047, 29, 508, 43818, 16, 20, 16, 21, 21, 20, 60, 366, 43818, 29, 366, 3122,
         29],
    52: [27, 91, 8691, 723, 427, 91, 1472, 82, 1784, 91, 318, 6213, 91, 29],
}
SMOLLM_IDS = [  # parse_special=True, one list per CASES entry
    [19556, 28, 905, 17],
    [19556, 28, 905, 17, 5549, 137, 94, 25972, 83, 7466, 84, 2756, 216, 33, 34, 35, 36, 37],
    [256, 2899, 5600, 284, 35079, 333],
    [100, 7366, 197, 397, 197, 197, 100, 7366, 198, 198, 2241, 198, 5110, 201, 198, 37066, 16506],
    [33, 34, 35, 36, 37, 38, 39, 40, 216, 35, 30, 33, 36, 33, 37, 41, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32,
     216, 32, 104, 33, 54, 216, 34, 32, 34, 36, 29, 33, 33, 29, 34, 41],
    [57, 5248, 1326, 982, 346, 3060, 392, 3543, 502, 2316, 1041, 6737, 357, 506, 339, 23, 61, 422, 2154, 23, 68],
    [47682, 25972, 83, 7466, 84, 2756, 15486, 46494, 37366, 412, 2756, 5422, 2756, 5549, 223, 863, 1321, 45682],
    [391, 33777, 42, 47526, 10813, 235, 231, 10813, 233, 138, 10813, 225, 121, 10813, 225, 132, 4636, 247, 114,
     31752, 15107, 114, 240, 10813, 244, 218],
    [1604, 275, 24, 104, 727, 472, 585, 1792, 42, 448, 1003, 1792, 1672, 216, 34, 472, 1003, 1943, 198],
    [28589, 29184, 37349, 16313, 231, 43222, 229, 16313, 239, 24713, 18645, 250, 48392, 138, 12831, 7906, 240,
     178, 239, 230, 8083, 219, 15076, 228, 18614, 119, 18614, 119, 177, 125, 238, 29157, 226, 48392, 138,
     19076],
    [23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226, 29917, 10391, 121,
     10391, 140, 10391, 121, 11100, 228, 29917, 7365, 127, 10391, 227, 7365, 230, 7365, 120, 19076, 33085,
     246, 181, 130, 251, 183, 240, 129, 48138, 223, 231, 183, 228, 114, 184, 228, 133],
    [1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198],
    [1, 9690, 198, 2683, 359, 5356, 30, 2],
    [2692, 0, 3143, 1694, 0],
    [44, 19324, 79, 4350, 46, 198, 39428, 1245, 1799, 476, 86, 23597, 198, 9617, 19324, 79, 4350, 46],
    [44, 108, 86, 306, 79, 12821, 108, 46, 1604, 253, 3734, 44, 108, 86, 306, 79, 30370, 108, 46, 198, 44, 108,
     86, 306, 79, 22876, 108, 46],
    [256, 11181, 3354, 1792, 216, 329, 256, 1892, 289],
    [153, 239, 17162, 17162, 25723, 11517, 12001, 21118, 26112, 5470, 250, 14714, 9382, 39511, 7872, 24958,
     38106, 6643, 13760, 24674, 27819, 34966, 20602, 31462, 23339, 43463, 12960, 112, 37657, 30825, 28532,
     120, 12335, 134, 27011, 30658, 16525, 44757, 37189],
    [81, 15442, 82, 321, 221, 83, 321, 229, 84, 12109, 218, 85],
    [9212, 20, 20749, 3394, 41407, 5728, 10095, 9148, 16693, 4563, 21749, 446, 1189, 1232, 11444, 216, 9493,
     110],
    [4687, 1742, 7434, 30, 824, 31, 1537, 47, 8433, 45, 33, 22, 104, 45, 105, 19, 28082],
    [51, 14548, 10802, 21268, 14321, 79, 7544, 79, 3002, 902, 82, 369, 29, 7544, 29, 3002, 15341, 48815, 4728,
     79, 51, 13108],
    [31069, 31069, 31069, 31069, 31069, 31069, 31069, 31069, 31069, 31069, 453, 369, 369, 369, 369, 369, 369,
     369, 369, 369, 369, 369, 369, 369, 369, 369, 369, 369, 369, 369, 369, 369, 369, 369, 369, 369, 369,
     369, 369, 369],
    [198],
    [216],
    [],
    [35781, 216, 33, 81, 34, 82, 35, 83, 216, 33, 32, 104, 216, 35, 7212, 216, 33, 32, 32, 21, 1885, 37, 30, 41,
     41],
    [44, 108, 306, 79, 3738, 108],
    [2, 2],
    [256, 1, 216, 23861, 256, 2, 256],
    [1, 9690, 198, 2683, 359, 1606, 30219, 28, 2312, 411, 1065, 505, 20534, 14698, 30, 1206, 359, 253, 5356,
     11173, 30, 2, 198, 1, 4093, 198, 19161, 253, 421, 30614, 563, 45742, 30, 2, 198, 1, 520, 9531, 198,
     23685, 4656, 7626, 2, 198, 1, 4093, 198, 2696, 582, 563, 44796, 30, 2, 198, 1, 520, 9531, 198],
    [85, 151, 219, 253, 151, 226, 304, 151, 221, 9301],
    [37307, 216, 164, 111, 164, 112, 164, 113, 216, 19133, 39050, 216, 16738, 216, 173, 223, 121, 216, 173, 223,
     132, 216, 8083, 242, 8083, 243, 216, 23159, 249, 243, 23159, 249, 244],
    [106, 103, 90, 15107, 235, 118, 321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117, 7048, 15107, 233, 128,
     31752, 321, 231, 10813, 230, 226],
    [39673, 216, 190, 191, 195, 212, 75, 32, 93, 217, 1112],
    [1311, 321, 118, 29070, 321, 119, 39879, 141, 223, 5824, 199, 35038, 200, 484],
    [198, 3717, 256, 472, 198],
    [40686, 12427, 333, 1792],
    [41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41,
     41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41, 41],
    [1855, 318, 16107, 99, 16107, 100, 1326, 417, 100, 619, 385, 5036, 573],
    [11957, 18299, 637, 67, 637, 16421, 637, 18525, 637, 3256, 637, 52, 637, 61, 637, 68],
    [25276, 2, 1604, 1, 460, 89],
    [1, 1],
    [333, 641, 6574, 198, 197, 1311, 11181, 198],
    [81, 30, 82, 28, 83, 43, 84, 42, 85, 17, 86, 47, 87, 24, 88, 12993, 89, 36939, 90, 109, 44, 91, 46],
    [104, 446, 933, 33, 28, 216, 34, 28, 216, 35, 77, 198, 3272, 24, 86, 14737, 104, 17, 98, 15201, 216, 907,
     5189, 198],
    [4, 22139, 5, 2153, 6, 86, 30, 1306, 7, 33, 32],
    [173, 236, 131, 4636, 236, 132, 4636, 222, 221, 4636, 222, 112, 11435, 3351, 123, 19995, 235, 19995, 121,
     19995, 244, 19995, 248, 21004, 250, 38599],
    [10813, 242, 218, 10813, 242, 219, 10813, 242, 218, 10813, 242, 219, 10813, 242, 218, 10813, 242, 219,
     10813, 242, 218, 10813, 242, 219, 10813, 242, 218, 10813, 242, 219],
    [10214, 10214, 10214, 10214, 10214, 10214, 10214, 10214, 10214, 10214, 10214, 10214, 10214, 10214, 10214,
     10214, 10214, 10214, 10214, 10214],
    [369, 23, 13133, 23, 721, 637, 31942, 23, 10922],
    [486, 9617, 99, 46, 3738, 44, 99, 46, 933, 64, 3907, 33, 37, 33, 38, 38, 37, 77, 2067, 64, 3907, 46, 2067,
     5131, 46],
    [0, 9617, 99, 46, 2],
]
SMOLLM_IDS_NO_SPECIAL = {  # parse_special=False, where it differs (CASES index: ids)
    11: [44, 108, 306, 79, 3738, 108, 46, 4093, 198, 6004, 44, 108, 306, 79, 486, 108, 46, 198, 44, 108, 306,
         79, 3738, 108, 46, 520, 9531, 198],
    12: [44, 108, 306, 79, 3738, 108, 46, 9690, 198, 2683, 359, 5356, 15602, 108, 306, 79, 486, 108, 46],
    13: [2692, 44, 108, 486, 1714, 2692, 108, 46, 3143, 1694, 44, 108, 486, 1714, 2692, 108, 46],
    28: [44, 108, 306, 79, 486, 108, 21198, 108, 306, 79, 486, 108, 46],
    29: [216, 2067, 108, 306, 79, 3738, 108, 46, 216, 23861, 216, 2067, 108, 306, 79, 486, 108, 46, 256],
    30: [44, 108, 306, 79, 3738, 108, 46, 9690, 198, 2683, 359, 1606, 30219, 28, 2312, 411, 1065, 505, 20534,
         14698, 30, 1206, 359, 253, 5356, 11173, 15602, 108, 306, 79, 486, 108, 46, 198, 44, 108, 306,
         79, 3738, 108, 46, 4093, 198, 19161, 253, 421, 30614, 563, 45742, 15602, 108, 306, 79, 486,
         108, 46, 198, 44, 108, 306, 79, 3738, 108, 46, 520, 9531, 198, 23685, 4656, 7626, 44, 108, 306,
         79, 486, 108, 46, 198, 44, 108, 306, 79, 3738, 108, 46, 4093, 198, 2696, 582, 563, 44796,
         15602, 108, 306, 79, 486, 108, 46, 198, 44, 108, 306, 79, 3738, 108, 46, 520, 9531, 198],
    41: [25276, 44, 108, 306, 79, 486, 108, 46, 1604, 44, 108, 306, 79, 3738, 108, 46, 460, 89],
    42: [44, 108, 306, 79, 3738, 108, 21198, 108, 306, 79, 3738, 108, 46],
    46: [44, 10368, 46, 22139, 44, 2153, 79, 29070, 46, 2153, 44, 5805, 46, 86, 30, 1306, 44, 460, 79, 9888, 46,
         33, 32],
    52: [44, 108, 486, 1714, 2692, 108, 29299, 99, 21198, 108, 306, 79, 486, 108, 46],
}
SMOLLM_AS_LLAMABPE = {  # where the ids differ from SMOLLM_IDS (after the BOS)
    3: [1, 100, 7366, 197, 397, 197, 197, 100, 7366, 1116, 2241, 198, 5110, 2738, 37066, 16506],
    8: [1, 1604, 275, 24, 104, 727, 198, 333, 585, 1792, 42, 198, 415, 1003, 1792, 1672, 216, 34, 198, 333,
         1003, 1943, 198],
    16: [1, 256, 11181, 198, 197, 1792, 216, 329, 256, 1892, 289],
}
SMOLLM_AS_GPT2 = {  # where the ids differ from SMOLLM_IDS
    32: [37307, 16936, 111, 164, 112, 164, 113, 3351, 127, 39050, 3351, 138, 4636, 223, 121, 4636, 223, 132,
         216, 8083, 242, 8083, 243, 216, 23159, 249, 243, 23159, 249, 244],
}
SMOLLM_AS_NOPRE = {  # where the ids differ from SMOLLM_IDS
    5: [57, 23, 93, 1326, 23, 100, 346, 23, 764, 392, 23, 307, 502, 23, 257, 1041, 23, 84, 357, 23, 99, 339,
         23, 61, 422, 2154, 23, 68],
    8: [1604, 275, 24, 104, 727, 472, 585, 1792, 42, 448, 1003, 1792, 216, 26, 216, 34, 472, 1003, 1943, 198],
    14: [44, 19324, 79, 4350, 46, 198, 39428, 1245, 1799, 216, 18, 86, 23597, 198, 9617, 19324, 79, 4350, 46],
    19: [9212, 20, 216, 3757, 216, 41407, 48, 216, 29646, 216, 16693, 47, 216, 2026, 216, 5583, 216, 28733, 216,
         11444, 27, 216, 9493, 110],
    26: [35781, 216, 33, 81, 34, 82, 35, 83, 216, 33, 32, 104, 216, 35, 7212, 216, 33, 32, 32, 21, 216, 20, 37,
         30, 41, 41],
    39: [1855, 318, 216, 417, 99, 216, 417, 100, 1326, 417, 100, 216, 1585, 385, 5036, 573],
    40: [11957, 18299, 216, 23, 67, 216, 23, 16421, 216, 23, 18525, 216, 23, 3256, 216, 23, 52, 216, 23, 61,
         216, 23, 68],
    45: [104, 216, 45, 216, 75, 33, 28, 216, 34, 28, 216, 35, 77, 198, 3272, 24, 86, 14737, 104, 17, 98, 15201,
         256, 19, 5189, 198],
    50: [369, 23, 13133, 23, 721, 216, 23, 31942, 23, 216, 3816],
    51: [486, 9617, 99, 46, 3738, 44, 99, 46, 216, 75, 64, 3907, 33, 37, 33, 38, 38, 37, 77, 216, 44, 64, 3907,
         46, 216, 44, 5131, 46],
}
# fmt: on


@pytest.fixture(scope="module")
def qwen_meta(qwen_path):
    return open_gguf(qwen_path).metadata


@pytest.fixture(scope="module")
def smollm_meta(smollm_path):
    return open_gguf(smollm_path).metadata


@pytest.fixture(scope="module")
def qwen(qwen_meta):
    return Tokenizer.from_metadata(qwen_meta)


@pytest.fixture(scope="module")
def smollm(smollm_meta):
    return Tokenizer.from_metadata(smollm_meta)


def _with(meta, **changes):
    """A copy of ``meta`` with tokenizer.ggml.* keys replaced (None removes the key)."""
    out = dict(meta)
    for k, v in changes.items():
        out.pop(f"tokenizer.ggml.{k}", None)
        if v is not None:
            out[f"tokenizer.ggml.{k}"] = v
    return out


def _check_all(tok, expected, parse_special=True):
    bad = [(c, tok.encode(c, parse_special=parse_special), e) for c, e in zip(CASES, expected)
           if tok.encode(c, parse_special=parse_special) != e]
    assert not bad, "\n".join(f"{c!r}: got {g}, llama.cpp {e}" for c, g, e in bad[:5])


def test_published_ids(qwen, smollm):
    assert qwen.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert smollm.encode("Hello, world! ünïcödé 12345") == [
        19556, 28, 905, 17, 5549, 137, 94, 25972, 83, 7466, 84, 2756, 216, 33, 34, 35, 36, 37]


@pytest.mark.parametrize("name", ["qwen", "smollm"])
def test_matches_llama_tokenize(name, request):
    tok = request.getfixturevalue(name)
    expected = QWEN_IDS if name == "qwen" else SMOLLM_IDS
    _check_all(tok, expected)
    no_special = QWEN_IDS_NO_SPECIAL if name == "qwen" else SMOLLM_IDS_NO_SPECIAL
    _check_all(tok, [no_special.get(i, e) for i, e in enumerate(expected)], parse_special=False)


@pytest.mark.parametrize("pre,diff,bos", [("llama-bpe", SMOLLM_AS_LLAMABPE, [1]), ("gpt-2", SMOLLM_AS_GPT2, []),
                                          (None, SMOLLM_AS_NOPRE, [])])
def test_other_pre_tokenizers_match_llama_tokenize(smollm_meta, pre, diff, bos, caplog):
    changes = {"pre": pre, "add_bos_token": None} if pre == "llama-bpe" else {"pre": pre}
    with caplog.at_level(logging.WARNING, logger="minfer_core.tokenizer"):
        tok = Tokenizer.from_metadata(_with(smollm_meta, **changes))
    assert ("missing" in caplog.text) == (pre is None)  # llama.cpp warns and uses 'default'
    _check_all(tok, [diff.get(i, bos + e) for i, e in enumerate(SMOLLM_IDS)])


def test_pre_tokenizer_aliases_and_errors(qwen_meta, smollm_meta, qwen):
    alias = Tokenizer.from_metadata(_with(qwen_meta, pre="deepseek-r1-qwen"))
    assert [alias.encode(c) for c in CASES] == QWEN_IDS  # llama.cpp maps it to the qwen2 regex
    with pytest.raises(ValueError, match="unsupported pre-tokenizer.*no-such-pre"):
        Tokenizer.from_metadata(_with(smollm_meta, pre="no-such-pre"))
    with pytest.raises(NotImplementedError, match="llama"):
        Tokenizer.from_metadata(_with(smollm_meta, model="llama"))


def test_special_tokens_like_llama_cpp(qwen, smollm):
    assert (qwen.bos_id, qwen.eos_id, qwen.add_bos, qwen.vocab_size) == (151643, 151645, False, 151936)
    assert qwen.eog_ids == {128247, 151643, 151645, 151662, 151663, 151664}
    assert (smollm.bos_id, smollm.eos_id, smollm.add_bos, smollm.vocab_size) == (1, 2, False, 49152)
    assert smollm.eog_ids == {0, 2, 4}
    assert qwen.token_text(1879) == "Ġworld" and qwen.token_text(151644) == "<|im_start|>"


def test_add_bos(smollm_meta, smollm):
    assert smollm.encode("hi") == smollm.encode("hi", add_special=False)  # the file says add_bos_token = false
    forced = Tokenizer.from_metadata(_with(smollm_meta, add_bos_token=True))
    assert forced.encode("hi") == [1] + smollm.encode("hi")
    assert forced.encode("hi", add_special=False) == smollm.encode("hi")
    llama = Tokenizer.from_metadata(_with(smollm_meta, pre="llama-bpe", add_bos_token=None))
    assert llama.add_bos and llama.encode("")[0] == 1  # llama-bpe's default when the key is absent
    no_ids = Tokenizer.from_metadata(_with(smollm_meta, bos_token_id=None, eos_token_id=None))
    assert (no_ids.bos_id, no_ids.eos_id) == (11, 11)  # llama.cpp's gpt2 defaults


def test_control_tokens_parsed_or_not(qwen):
    text = "<|im_start|>user\nhi<|im_end|>"
    parsed = qwen.encode(text)
    assert parsed[0] == 151644 and parsed[-1] == 151645
    plain = qwen.encode(text, parse_special=False)
    assert 151644 not in plain and 151645 not in plain
    assert qwen.decode(plain) == qwen.decode(parsed) == text
    # user-defined tokens (token_type 4) are cut out even without parse_special, as in llama.cpp
    assert qwen.encode("<tool_call>", parse_special=False) == [151657]


@pytest.mark.parametrize("name", ["qwen", "smollm"])
def test_decode_roundtrip(name, request):
    tok = request.getfixturevalue(name)
    rng = random.Random(1234)
    pools = ["abc XYZ", " \t\n\r", "0123456789", "'.,!?-_()[]{}<>|", "éüñßøÅ", "中文字测试", "ひらがなカタ",
             "🙂🚀👍🏽\u200d", "Ωπσж", "\u0301\u0308"]
    texts = list(CASES) + ["".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 60)))
                           for _ in range(200)]
    for t in texts:
        assert tok.decode(tok.encode(t)) == t
        assert tok.decode(tok.encode(t, parse_special=False)) == t
    assert tok.decode(tok.encode("<|im_start|>a<|im_end|>"), special=False) == "a"


# llama.cpp's detokenizer (common_detokenize, printed as "res:" by its tests/test-tokenizer-0 built
# from the same commit) on the llama-bpe copy of the smollm2 vocabulary: clean_spaces is on there.
DETOKENIZED_LLAMA_BPE = {
    "Hello , world ! I 'm here . It 's a ' b don 't": "Hello, world! I'm here. It's a'b don 't",
    "x ' ' y": "x'' y",
    " ,leading and trailing ,": ",leading and trailing,",
    "a ?b !c .d ,e": "a?b!c.d,e",
    "we 're they 've you 'll I 'd she 's": "we're they've you 'll I 'd she's",
    "' s '' ' ' 'm": "' s '''''m",
    "  ,  .  double spaces": " , .  double spaces",
    "q ' 're ' 's": "q''re''s",
}


def test_decode_clean_spaces_like_llama_cpp(smollm_meta, smollm):
    tok = Tokenizer.from_metadata(_with(smollm_meta, pre="llama-bpe"))
    for text, expected in DETOKENIZED_LLAMA_BPE.items():
        assert tok.decode(tok.encode(text, add_special=False)) == expected
        assert smollm.decode(smollm.encode(text)) == text  # "smollm" keeps spaces (clean_spaces = false)


def test_stream_decoder_holds_back_partial_utf8(qwen):
    text = "emoji 🙂🫠🦩 runes ᚠᛇᚻ and 中文龘 end"
    ids = qwen.encode(text)
    pieces = [qwen.token_bytes(i) for i in ids]
    assert any(_invalid_utf8(p) for p in pieces), "the test needs a character split over tokens"
    sd = StreamDecoder(qwen)
    outs = [sd.push(i) for i in ids]
    assert "".join(outs) + sd.flush() == text
    assert "\ufffd" not in "".join(outs)
    for i, out in zip(ids, outs):
        assert out.encode("utf-8").decode("utf-8") == out
    cut = next(i for i in ids if _invalid_utf8(qwen.token_bytes(i)))
    sd = StreamDecoder(qwen)
    assert sd.push(cut) == "" and sd.flush() == "\ufffd"  # an unfinished character at the end
    assert StreamDecoder(qwen).push(151644) == ""  # control tokens hidden by default
    assert StreamDecoder(qwen, special=True).push(151644) == "<|im_start|>"


def _invalid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_encode_speed(qwen):
    rng = random.Random(0)
    words = ["the", "model", "tokenizer", "GPU", "def", "return", "    ", "\n", "中文", "12345", "ünïcödé", "🙂"]
    text = " ".join(rng.choice(words) for _ in range(2500))[:12000]
    qwen.encode("warm up")
    t0 = time.perf_counter()
    ids = qwen.encode(text)
    assert time.perf_counter() - t0 < 1.0
    assert qwen.decode(ids) == text


def _tiny_gguf(path, add_bos: bool):
    """A synthetic GGUF with a byte-only vocabulary (token id == byte value) and no merges."""
    import gguf

    b2u = bytes_to_unicode()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list([b2u[b] for b in range(256)] + ["<s>", "</s>"])
    w.add_token_types([1] * 256 + [3, 3])
    w.add_token_merges(["Ġ Ġ"])
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)
    w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _cli(argv, capsys):
    from minfer_core.commands import tokenize

    parser = argparse.ArgumentParser()
    tokenize.add_parser(parser.add_subparsers())
    args = parser.parse_args(["tokenize", *argv])
    assert tokenize.run(args) == 0
    return json.loads(capsys.readouterr().out)


def test_tokenize_command(qwen_path, tmp_path, capsys):
    assert _cli(["-m", str(qwen_path), "Hello, world!"], capsys) == [9707, 11, 1879, 0]
    assert _cli(["-m", str(qwen_path), "--no-parse-special", CASES[12]], capsys) == QWEN_IDS_NO_SPECIAL[12]
    tiny = _tiny_gguf(tmp_path / "tiny.gguf", add_bos=True)
    assert _cli(["-m", str(tiny), "hi </s>"], capsys) == [256, 104, 105, 32, 257]
    assert _cli(["-m", str(tiny), "--no-bos", "hi"], capsys) == [104, 105]
    assert _cli(["-m", str(tiny), "--no-parse-special", "</s>"], capsys) == [256, *b"</s>"]
