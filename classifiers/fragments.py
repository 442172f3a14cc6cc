# ruff: noqa: RUF001 -- Chinese text uses full-width punctuation on purpose
"""Hand-written text fragments that ``synth`` composes into SpecRoute's own training prompts.

Passages are shared by both classes on purpose: the same pasted text is followed by a structured
instruction (summarise, extract, answer from it) or an open-ended one (react, imagine, advise), so the
model has to read the instruction rather than the passage.
"""

from __future__ import annotations

PASSAGES = [
    "The city council met on Tuesday to discuss the proposed expansion of the northern tram line. "
    "Supporters argued that the extension would cut commuting times for roughly 40,000 residents, while "
    "opponents raised concerns about the 18-month construction period and the loss of parking along Elm "
    "Avenue. The council voted 7 to 4 to commission a further environmental study before the end of March.",
    "Photosynthesis takes place mainly in the leaves of plants, inside organelles called chloroplasts. "
    "Chlorophyll absorbs light, chiefly in the blue and red wavelengths, and the energy drives the "
    "conversion of carbon dioxide and water into glucose. Oxygen is released as a by-product. The process "
    "has two stages: the light-dependent reactions and the Calvin cycle.",
    "Our quarterly revenue reached 12.4 million euros, up 9% on the same quarter last year. Growth came "
    "mostly from the subscription business, which added 3,100 customers, while hardware sales fell by 4%. "
    "Operating costs rose because of two new offices in Lisbon and Krakow. Management expects margins to "
    "recover in the second half once the new billing platform is live.",
    "Maria Okafor joined the company in 2016 as a junior analyst and was promoted to head of logistics in "
    "2021. She led the migration of the warehouse system to the cloud and negotiated the contract with "
    "the shipping partner in Rotterdam. Before joining, she studied industrial engineering at the "
    "University of Lagos and worked for two years at a port authority.",
    "The hiking trail starts at the car park near the old mill and climbs steadily for 6 kilometres to "
    "the ridge. In summer the path is dry and well marked, but after heavy rain the lower section near "
    "the stream can flood. There is a mountain hut at the top that serves soup and tea between May and "
    "October. Dogs are allowed on a leash.",
    "Customer ticket #4471: I ordered the blue running shoes in size 42 on 3 June and received size 44. "
    "I sent them back on 8 June using the prepaid label but I still have not received a refund or the "
    "replacement. The tracking number for the return is RT-88213-GB. Please let me know what is going "
    "on, as this is the second time this has happened.",
    "The bridge was completed in 1932 after four years of work and was, at the time, the longest "
    "single-span steel arch in the country. It carries two railway tracks and a footpath. A major "
    "renovation between 2009 and 2012 replaced most of the deck and added LED lighting, and the structure "
    "is now listed as a heritage monument.",
    "Sleep researchers tracked 2,300 adults for five years and found that those who slept fewer than six "
    "hours a night were 30% more likely to report memory problems. The effect was stronger in people over "
    "60. The authors caution that the study shows an association rather than cause and effect, and that "
    "self-reported sleep can be inaccurate.",
    "Minutes of the product meeting, 14 May. Attendees: Jonas, Priya, Leo, Chen. Priya reported that the "
    "mobile app crash rate dropped to 0.3% after the last release. Leo proposed moving the dark-mode "
    "feature to the next sprint. Chen will prepare the pricing analysis by Friday. The next meeting is "
    "on 21 May at 10:00.",
    "The museum's new exhibition brings together more than 200 objects from the Bronze Age, including "
    "jewellery, tools and pottery found during the construction of the ring road. Visitors can also try a "
    "reconstructed loom and watch a short film about the excavation. The exhibition runs until 30 "
    "September and entry is free for children under 12.",
    "Lithium-ion batteries lose capacity over time because of side reactions at the electrodes. High "
    "temperatures and keeping a battery at full charge for long periods speed up this ageing. "
    "Manufacturers therefore recommend storing devices at around 50% charge in a cool place, and many "
    "laptops now offer a setting that stops charging at 80%.",
    "The volunteer group planted 1,200 trees along the river last autumn. Most were native species such "
    "as alder, willow and oak. A survey in spring showed that about 85% had survived the winter. The "
    "group is now looking for more volunteers and for a sponsor to pay for protective tubes against deer.",
    "Dear tenants, the water supply in building B will be interrupted on Thursday between 9:00 and 15:00 "
    "while the main pipe is replaced. Please store some water in advance and keep taps closed during the "
    "work. The lift will also be out of service for part of the day. We apologise for the inconvenience.",
    "The startup's app lets small farmers photograph a diseased leaf and receive a diagnosis within "
    "seconds. It was trained on 90,000 labelled images and currently recognises 38 diseases across nine "
    "crops. The founders say the app has been downloaded 250,000 times, mostly in Kenya and India, and "
    "they plan to add offline support this year.",
    "During the 19th century the town grew rapidly thanks to its textile mills, and its population rose "
    "from 5,000 to almost 60,000. When the mills closed in the 1970s, unemployment soared. Since 2000 the "
    "old factory buildings have been converted into flats, studios and a university campus.",
    "A balanced diet includes vegetables, fruit, whole grains, protein and healthy fats. Nutritionists "
    "recommend filling half the plate with vegetables and fruit, a quarter with grains and a quarter "
    "with protein. Drinking water instead of sugary drinks and limiting processed food also helps to "
    "maintain a healthy weight.",
    "The release notes for version 3.2 list three changes: the export dialog now supports PDF/A, the "
    "search index is rebuilt in the background instead of blocking the editor, and a bug that duplicated "
    "comments when pasting from another document has been fixed. Users on version 2.x must upgrade to "
    "3.0 first.",
    "On the island, the dry season lasts from December to April. Most visitors arrive in January, when "
    "hotel prices are highest. The rainy months bring short afternoon storms but also fewer crowds and "
    "greener landscapes. Ferries run twice a day from the mainland, and the crossing takes about 90 minutes.",
]

CJK_PASSAGES = [
    "本公司第三季度营业收入为8.6亿元，同比增长12%。其中线上业务增长较快，新增用户约45万人。"
    "由于原材料价格上涨，毛利率较上季度下降1.5个百分点。公司计划在明年上半年完成新工厂的建设。",
    "这条徒步路线全长12公里，从山脚的停车场出发，沿着溪流向上，大约需要四个小时。"
    "沿途有两个休息点，山顶有一座小寺庙。雨天路面湿滑，建议穿防滑鞋，并带足饮用水。",
    "会议纪要：5月10日，产品组召开周会。张伟汇报了新版本的测试进度，目前已修复缺陷37个。"
    "李娜建议推迟发布一周，以便完成性能测试。会议决定下周三再次评估发布时间。",
    "研究人员对三千名中学生进行了为期两年的调查，发现每天运动超过一小时的学生，"
    "数学成绩平均高出8分。研究者指出，这只是相关关系，还需要进一步的实验来证明因果关系。",
    "各位住户：因管道维修，本周四上午九点至下午三点小区将暂停供水。请提前储水，"
    "维修期间请关闭水龙头。给您带来的不便，敬请谅解。物业管理处。",
]

CODE_SNIPPETS = [
    (
        "python",
        "def average(values):\n    total = 0\n    for v in values:\n        total += v\n    return "
        "total / len(values)\n",
    ),
    (
        "python",
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
        "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n",
    ),
    (
        "javascript",
        "function groupBy(list, key) {\n  const out = {};\n  for (const item of list) {\n"
        "    (out[item[key]] ||= []).push(item);\n  }\n  return out;\n}\n",
    ),
    (
        "java",
        "public class Counter "
        "{\n    private int count = 0;\n\n    public void increment() {\n        count++;\n"
        "    }\n\n    public int get() {\n        return count;\n    }\n}\n",
    ),
    (
        "go",
        "func reverse(s string) string "
        "{\n\tr := []rune(s)\n\tfor i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {\n"
        "\t\tr[i], r[j] = r[j], r[i]\n\t}\n\treturn string(r)\n}\n",
    ),
    (
        "sql",
        "SELECT c.name, COUNT(o.id) AS orders\nFROM customers c\nLEFT JOIN orders o ON o.customer_id = c.id\n"
        "GROUP BY c.name\nORDER BY orders DESC;\n",
    ),
    (
        "rust",
        'fn fizzbuzz(n: u32) -> String {\n    match (n % 3, n % 5) {\n        (0, 0) => "FizzBuzz".into(),\n'
        '        (0, _) => "Fizz".into(),\n        (_, 0) => "Buzz".into(),\n        _ => '
        "n.to_string(),\n    }\n}\n",
    ),
    (
        "typescript",
        "interface User {\n  id: number;\n  name: string;\n  email?: string;\n}\n\n"
        "export function findUser(users: User[], id: number): User | undefined {\n"
        "  return users.find((u) => u.id === id);\n}\n",
    ),
    (
        "bash",
        '#!/bin/bash\nfor f in *.log; do\n  if [ -s "$f" ]; then\n    gzip "$f"\n  fi\ndone\n',
    ),
    (
        "python",
        "import csv\n\nwith open('data.csv') as fh:\n    reader = csv.DictReader(fh)\n    rows = [r for "
        "r in reader]\n"
        "print(len(rows))\n",
    ),
    (
        "c",
        "#include <stdio.h>\n\nint main(void) {\n    int sum = 0;\n    for (int i = 1; i <= 10; i++) {\n"
        '        sum += i;\n    }\n    printf("%d\\n", sum);\n    return 0;\n}\n',
    ),
    (
        "python",
        "def read_config(path):\n    cfg = {}\n    for line in open(path):\n        key, value = "
        "line.split('=')\n"
        "        cfg[key] = value\n    return cfg\n",
    ),
]

LANGUAGES = [
    "Python",
    "JavaScript",
    "TypeScript",
    "Go",
    "Rust",
    "Java",
    "C#",
    "C++",
    "Ruby",
    "Kotlin",
    "PHP",
    "Swift",
]

CODE_TASKS = [
    "checks whether a string is a palindrome",
    "returns the n-th Fibonacci number",
    "merges two sorted lists into one sorted list",
    "counts how many times each word appears in a text",
    "removes duplicate items from a list while keeping the order",
    "converts a temperature from Celsius to Fahrenheit",
    "reads a CSV file and prints the sum of the second column",
    "validates an email address",
    "flattens a nested list",
    "finds the largest number in an array",
    "parses a date string in the format YYYY-MM-DD",
    "sends an HTTP GET request and prints the status code",
    "computes the factorial of a number recursively",
    "sorts a list of dictionaries by the 'age' key",
    "implements binary search on a sorted array",
    "chunks a list into pieces of size k",
    "checks if two strings are anagrams",
    "retries a function call up to three times with exponential backoff",
    "implements a simple LRU cache",
    "converts a Roman numeral to an integer",
    "generates a random password of a given length",
    "calculates the moving average of a list of numbers",
    "transposes a matrix",
    "capitalises the first letter of every word in a sentence",
]

SQL_TASKS = [
    "the ten customers who spent the most in 2023",
    "all employees hired after January 2020, ordered by salary",
    "the average order value per month",
    "products that have never been ordered",
    "the number of users per country, only countries with more than 100 users",
    "duplicate email addresses in the users table",
    "the second highest salary in each department",
    "orders placed in the last 7 days together with the customer name",
]

SHELL_TASKS = [
    "find all files larger than 100 MB under /var",
    "count the lines in every .py file in this directory",
    "replace 'foo' with 'bar' in all .txt files recursively",
    "show the 10 processes using the most memory",
    "archive the logs folder into a tar.gz with today's date in the name",
    "list the files modified in the last 24 hours",
    "kill the process listening on port 8080",
    "print the disk usage of each subdirectory, sorted",
]

REGEX_TASKS = [
    "UK postcodes",
    "IPv4 addresses",
    "dates written like 2024-03-15",
    "hexadecimal colour codes such as #a3f or #A0B1C2",
    "words that start with a capital letter and end with 'ing'",
    "lines that contain exactly three digits",
    "US phone numbers like (555) 123-4567",
    "strings that contain only letters and underscores",
]

CONFIG_TASKS = [
    ("docker-compose.yml", "a web app with a Postgres database and a Redis cache"),
    ("Kubernetes Deployment manifest", "an nginx container with 3 replicas and a readiness probe"),
    ("nginx server block", "a reverse proxy to localhost:3000 with gzip enabled"),
    (".gitignore", "a Python project that uses virtual environments and Jupyter notebooks"),
    ("GitHub Actions workflow", "running pytest on Python 3.10 and 3.11 on every push"),
    ("systemd unit file", "a service that runs /opt/app/server and restarts on failure"),
    ("pyproject.toml", "a package named 'weather-tools' with requests and click as dependencies"),
    ("ESLint config in JSON", "a React project that uses TypeScript"),
    ("Prometheus scrape config", "two targets on ports 9100 and 9200"),
    ("Terraform file", "an S3 bucket with versioning turned on"),
    ("logrotate config", "rotating /var/log/myapp/*.log daily and keeping 14 copies"),
    ("Ansible playbook", "installing nginx and starting it on all hosts in the 'web' group"),
]

LINES_TO_COPY = [
    "The quick brown fox jumps over the lazy dog.",
    "All work and no play makes Jack a dull boy.",
    "I will not talk in class.",
    "Hello, world!",
    "Practice makes perfect.",
    "ERROR: connection timed out",
    "- [ ] review pull request",
    "| id | name | status |",
    "SELECT * FROM users;",
    "Keep calm and carry on.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
    "We wish you a merry Christmas",
    "Row, row, row your boat",
    "Test line number one",
    "2024-01-01 00:00:00 INFO server started",
    "The meeting is moved to Friday at 3 pm.",
]

NAMES = [
    "Anna",
    "Ben",
    "Chloe",
    "David",
    "Elena",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jamal",
    "Kai",
    "Lena",
    "Mateo",
    "Nora",
    "Omar",
    "Paula",
    "Quinn",
    "Rosa",
    "Sven",
    "Tara",
    "Uma",
    "Victor",
    "Wei",
    "Yara",
]
CITIES = [
    "Lisbon",
    "Oslo",
    "Nairobi",
    "Toronto",
    "Osaka",
    "Lima",
    "Krakow",
    "Dublin",
    "Austin",
    "Hanoi",
    "Porto",
    "Seville",
    "Bergen",
    "Leeds",
    "Perth",
    "Quito",
]
PRODUCTS = [
    "wireless headphones",
    "standing desk",
    "espresso machine",
    "hiking backpack",
    "e-reader",
    "robot vacuum",
    "electric kettle",
    "yoga mat",
    "smart watch",
    "office chair",
    "air purifier",
]

STORY_TOPICS = [
    "a lighthouse keeper who finds a message in a bottle",
    "a robot learning to bake bread",
    "two rival chefs stuck in an elevator",
    "a dragon who is afraid of heights",
    "the last day of summer camp",
    "a detective who can hear plants",
    "a city where it never stops raining",
    "a grandmother who was secretly a spy",
    "a time traveller who misses the bus",
    "a cat who becomes mayor of a small town",
    "first contact with aliens who only speak in music",
    "a child who befriends the moon",
    "a violinist who loses her hearing",
    "a village that forgets everything each winter",
    "a librarian guarding a book that writes itself",
    "an astronaut alone on Mars talking to a plant",
]

POEM_TOPICS = [
    "autumn leaves",
    "the ocean at night",
    "a first love",
    "leaving home",
    "city lights",
    "my grandfather's hands",
    "the smell of rain",
    "friendship",
    "a broken clock",
    "winter mornings",
    "the stars",
    "coffee",
    "hope after loss",
    "a garden in spring",
    "the sound of trains",
]

OPEN_QUESTIONS = [
    "Why do people enjoy scary movies?",
    "What makes a good leader?",
    "Is it better to rent or buy a house?",
    "What do you think happens after we die?",
    "How has social media changed friendship?",
    "Why is the sky blue?",
    "What would the world look like without money?",
    "Do you think artificial sweeteners are healthy?",
    "What is the meaning of life?",
    "How do birds know where to migrate?",
    "Why did the Roman Empire fall?",
    "Is remote work good for society?",
    "What is consciousness?",
    "Why do we dream?",
    "Should schools teach philosophy to children?",
    "Can money buy happiness?",
    "How do you think cities will change in the next fifty years?",
    "What's the hardest part about learning a new language?",
    "Why are some people morning people and others night owls?",
    "What's your take on modern art?",
    "How does inflation affect ordinary families?",
    "Why do cats purr?",
    "What makes a book a classic?",
    "Is space exploration worth the cost?",
]

ADVICE = [
    "I just moved to a new city and I don't know anyone. How can I make friends?",
    "My manager keeps giving me extra work and I'm exhausted. What should I do?",
    "I'm nervous about a job interview tomorrow. Any tips?",
    "How can I stop procrastinating?",
    "My teenage son barely talks to me anymore. How can I reconnect with him?",
    "I want to start running but I always give up after a week. Any advice?",
    "What should I consider before adopting a dog?",
    "I can't decide between studying medicine and studying art. Help me think it through.",
    "How do I tell my friend that I feel hurt by something she said?",
    "I have trouble sleeping lately. What could help?",
    "I'm planning a trip to Japan for two weeks. What should I not miss?",
    "How can I save money when I have a low income?",
    "My partner and I keep arguing about chores. How do we fix this?",
    "What's a good way to prepare for retirement in my forties?",
    "I feel stuck in my career. What are my options?",
    "How do I deal with a noisy neighbour politely?",
]

BRAINSTORM = [
    "names for a bakery that specialises in sourdough",
    "fun things to do on a rainy weekend with kids",
    "gift ideas for my father who loves fishing",
    "themes for a 30th birthday party",
    "ways to make our team meetings less boring",
    "slogans for a bicycle repair shop",
    "hobbies I could pick up in winter",
    "topics for a podcast about history",
    "date night ideas on a budget",
    "ways to reduce plastic at home",
    "titles for my fantasy novel",
    "questions to ask on a first date",
]

CHITCHAT = [
    "hi there! how's it going?",
    "good morning :)",
    "I'm bored, talk to me",
    "what's your favourite movie?",
    "guess what, I got the job!!",
    "ugh, mondays",
    "do you like music?",
    "tell me something interesting",
    "I had the weirdest dream last night",
    "thanks, that was really helpful!",
    "lol that's funny. what else?",
    "how was your weekend?",
    "can you cheer me up a bit?",
    "what should I cook tonight?",
    "I just finished a marathon!",
    "hey, are you there?",
]

PERSONAS = [
    ("a grumpy pirate captain", "sailing the Caribbean in 1720"),
    ("Sherlock Holmes", "investigating a theft at a London museum"),
    ("a friendly medieval innkeeper", "serving travellers on a stormy night"),
    ("a wise old wizard", "teaching a young apprentice"),
    ("a cheerful barista", "chatting with regular customers"),
    ("a space station commander", "dealing with a mysterious signal"),
    ("a nervous job candidate", "in the middle of an interview"),
    ("a Victorian ghost", "haunting a modern apartment"),
    ("a tour guide in ancient Rome", "showing visitors the Forum"),
    ("a hard-boiled 1940s detective", "questioning a suspect"),
    ("a retired astronaut", "talking to a class of school children"),
    ("a mischievous fairy", "granting wishes with a twist"),
]

CJK_OPEN = [
    "写一首关于秋天的诗。",
    "给我讲一个关于小狐狸的故事。",
    "你觉得人生的意义是什么？",
    "我最近压力很大，怎么办？",
    "如果你可以穿越到古代，你想去哪个朝代？为什么？",
    "帮我想几个适合周末和朋友一起做的活动。",
    "请以“雨夜”为题写一篇短文。",
    "你怎么看待年轻人躺平的现象？",
    "假设你是一名宇航员，描述一下你在太空中的一天。",
    "今天心情不好，陪我聊聊天吧。",
    "给我的新咖啡店起几个有创意的名字。",
    "写一段关于友情的歌词。",
    "你认为未来的城市会是什么样子？",
    "如何才能更好地与父母沟通？",
]

CJK_STRUCT = [
    "用Python写一个函数，判断一个数是否为质数。",
    "请写一个SQL查询，统计每个部门的员工人数。",
    "把下面这句话重复十遍：我爱学习。",
    '请将以下JSON转换为YAML格式：{"name": "张三", "age": 28, "city": "北京"}',
    "写一个正则表达式，匹配中国大陆的手机号码。",
    "用JavaScript实现数组去重。",
    "继续这个数列：3, 6, 9, 12, 15,",
    "写一个Shell命令，查找当前目录下所有大于10MB的文件。",
    "请把下面的数据整理成Markdown表格：苹果 5元，香蕉 3元，橙子 4元。",
    "请按照以下模板生成三位员工的信息卡：姓名：__ 部门：__ 工号：__",
]

# short requests for an artefact: verb + artefact + purpose
ARTEFACT_VERBS = [
    "Write",
    "Create",
    "Generate",
    "Give me",
    "Produce",
    "Draft",
    "Make",
    "I need",
    "Show me",
    "Can you write",
    "Please create",
    "Set up",
    "Build",
    "Prepare",
]
ARTEFACTS = [
    "a Dockerfile",
    "a docker compose file",
    "a Kubernetes CronJob",
    "a Helm chart values file",
    "a Makefile",
    "a CircleCI config",
    "a Jenkinsfile",
    "a Vagrantfile",
    "an Apache virtual host",
    "a Caddyfile",
    "a supervisord config",
    "a redis.conf",
    "a postgresql.conf snippet",
    "a Traefik config",
    "an OpenAPI spec",
    "a JSON Schema",
    "a package.json",
    "a requirements.txt",
    "a Cargo.toml",
    "a webpack config",
    "a Vite config",
    "a babel config",
    "a .prettierrc",
    "a Jest config",
    "an Azure pipeline YAML",
    "a CloudFormation template",
    "a Serverless framework config",
    "a launch.json for VS Code",
    "a log4j2.xml",
    "an appsettings.json",
    "a .bashrc alias block",
    "a Python dataclass",
    "a TypeScript interface",
    "a Rust enum",
    "a SQL table definition",
    "a GraphQL schema",
    "a protobuf message",
    "a C header file",
    "a unit test",
    "a pytest fixture",
    "a CSV header and five sample rows",
    "a YAML list",
    "an XML sitemap",
    "an HTML form",
    "a CSS grid layout",
]
ARTEFACT_PURPOSES = [
    "for a Flask API",
    "for a static website",
    "for a Node.js service",
    "for a Go microservice",
    "for a Java Spring app",
    "with sensible defaults",
    "for local development",
    "for production",
    "for a blog with users and posts",
    "for an online shop",
    "that runs tests on every pull request",
    "for a data pipeline",
    "for a chat application",
    "with two environments, staging and prod",
    "",
]
NUMERIC_ASKS = [
    "List the first {n} prime numbers.",
    "Print the numbers from {a} to {b}.",
    "What are the first {n} multiples of {k}?",
    "Show every number between {a} and {b} that is divisible by {k}.",
    "Write the first {n} terms of the sequence a(n) = {k}n + {a}.",
    "Give me the cubes of 1 through {n}.",
    "Generate the even numbers up to {b}.",
    "Count up by {k}s from {a} until you pass {b}.",
    "Enumerate the integers from {b} down to {a}.",
    "Produce the first {n} powers of {k}.",
    "Output a times table for {k}, from {k} x 1 to {k} x {n}.",
    "Number each line from 1 to {n}.",
    "Sequence: {a}, {a2}, {a3}, ... keep going for {n} more terms.",
    "{a} {a2} {a3} {a4} — next {n} please",
]
TEMPLATE_ASKS = [
    "Create a template for {doc} with the sections {s1}, {s2} and {s3}.",
    "Write {doc} using these headings: {s1} / {s2} / {s3}.",
    "Fill out {doc} for {name} with the fields {s1}, {s2}, {s3}.",
    "Produce {doc} in a fixed layout: {s1}: ..., {s2}: ..., {s3}: ...",
    "Draft {doc} following the standard structure ({s1}, {s2}, {s3}) for our team.",
    "Make {doc} as a table with the columns {s1}, {s2}, {s3}.",
]
TEMPLATE_DOCS = [
    "a bug report",
    "a project status update",
    "an onboarding checklist",
    "a purchase order",
    "a shift schedule",
    "a test plan",
    "a post-mortem",
    "a press release skeleton",
    "a lesson plan",
    "an expense report",
    "a risk register",
    "a data sheet",
]
TEMPLATE_SECTIONS = [
    "Summary",
    "Owner",
    "Due date",
    "Status",
    "Steps to reproduce",
    "Expected result",
    "Actual result",
    "Budget",
    "Risks",
    "Next steps",
    "Attendees",
    "Decisions",
    "Scope",
    "Quantity",
    "Unit price",
    "Total",
    "Priority",
    "Contact",
]

# Copy-these-lines prompts: verbs, qualifiers, objects and the blocks that get pasted
COPY_VERBS = [
    "copy",
    "reproduce",
    "retype",
    "type out",
    "write out",
    "transcribe",
    "echo back",
    "duplicate",
    "repeat",
    "say back",
    "print",
    "output",
    "rewrite",
    "paste back",
    "recite",
    "mirror",
    "return",
]
COPY_QUALIFIERS = [
    "exactly",
    "verbatim",
    "word for word",
    "exactly as written",
    "unchanged",
    "character for character",
    "without any changes",
    "keeping the line breaks",
    "as is",
    "with no edits",
    "",
]
COPY_OBJECTS = [
    "these lines",
    "the text below",
    "this list",
    "the lines above",
    "my notes",
    "the following block",
    "this sentence",
    "the log below",
    "this paragraph",
    "the verse",
    "these rows",
    "the snippet",
    "it",
]
COPY_COUNTS = [
    "",
    "",
    "twice",
    "three times",
    "again",
    "two times, numbering each copy",
    "once, then again in reverse order",
    "and then once more in capital letters",
    "five times in a row",
    "back to me",
]
COPY_PURPOSES = [
    "",
    " for my test fixture",
    " so I can check the encoding",
    " for a typing exercise",
    " into your reply",
    " — I need it for a form",
    " for the sample file",
]
COPY_BLOCKS = [
    "- buy eggs\n- pick up the dry cleaning\n- email the landlord\n- water the plants",
    "Milk 2L\nBread (wholegrain)\nApples x6\nCoffee beans\nDish soap",
    "The hills were green beneath the rain,\nThe river ran its ancient lane,\n"
    "And every window, lit and wide,\nkept out the dark that waited outside.",
    "Over the fields the swallows go,\nhigh in the blue and then down low;\n"
    "the farmer whistles at the plough,\nthe summer is not over now.",
    "Flat 4, 18 Harbour Road\nPortsmouth PO1 3LT\nUnited Kingdom",
    "ID  NAME      SCORE\n01  Maria     88\n02  Kwame     92\n03  Lin       79",
    "[09:14:02] job started\n[09:14:05] fetching 312 records\n[09:14:09] wrote batch 1/4\n"
    "[09:14:12] wrote batch 2/4",
    "Step 1: unplug the router.\nStep 2: wait thirty seconds.\nStep 3: plug it back in.\n"
    "Step 4: wait for the green light.",
    "Dear Mr Patel,\nThank you for your letter of 4 May.\nWe will reply in full within ten days.\n"
    "Yours sincerely,\nJ. Moreau",
    "name: build\non: [push]\njobs:\n  test:\n    runs-on: ubuntu-latest",
    "Monday - gym\nTuesday - piano lesson\nWednesday - rest\nThursday - gym\nFriday - cinema",
    "alpha\nbravo\ncharlie\ndelta\necho\nfoxtrot",
    "Total due: 142.50 EUR\nDue date: 30 June\nReference: INV-20931",
    "Twinkle, twinkle, little star,\nHow I wonder what you are!\nUp above the world so high,\n"
    "Like a diamond in the sky.",
    "All good things must come to an end.",
    "Please keep this door closed at all times.",
    "Version 2.4.1 fixes the login timeout on slow networks.",
]
MORE_CONFIG_TASKS = [
    ("application.properties", "a Spring Boot app talking to PostgreSQL on localhost"),
    ("application.yml", "a Spring Boot service on port 8081 with debug logging"),
    (".editorconfig", "four-space indents and LF line endings"),
    ("tsconfig.json", "a strict TypeScript library compiled to ES2020"),
    ("Makefile", "building, testing and cleaning a small C project"),
    ("Caddyfile", "serving example.com with automatic HTTPS and a reverse proxy to :8080"),
    ("my.cnf", "a MySQL server with utf8mb4 and a 1 GB buffer pool"),
    ("supervisord.conf", "running two worker processes of a Celery app"),
    ("Helm values.yaml", "an app with 2 replicas, an ingress and resource limits"),
    ("haproxy.cfg", "balancing HTTP traffic across three backend servers"),
    (".pre-commit-config.yaml", "black, ruff and end-of-file fixer hooks"),
    ("Procfile", "a web process running gunicorn and a worker process"),
    ("redis.conf snippet", "enabling AOF persistence and a 256 MB memory limit"),
    ("babel.config.js", "a React project targeting the last two browser versions"),
]
